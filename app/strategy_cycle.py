"""Cycling the decoding strategy through the named presets (ctrl+s / F2)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from engine.strategy import ADAPTIVE, CYCLE, Strategy, preset


@dataclass
class CycleResult:
    """The preset to switch to (None if none is usable) and why the ones before it were skipped."""

    strategy: Strategy | None
    skipped: list[str] = field(default_factory=list)

    def notice(self, models_key: str = "Ctrl+O") -> str:
        """The skipped presets in one notice, those skipped for the same reason on one line
        ("skipped sd, tree, mab, optimal: a drafter model is needed (Ctrl+O picks a target with its
        drafter)"); ``models_key``: the model picker's key in the user's keymap."""
        by_reason: dict[str, list[str]] = {}
        for line in self.skipped:
            name, _, reason = line.removeprefix("skipped ").partition(": ")
            if "needs a drafter model" in reason:  # the engine's advice is the CLI's (--drafter REF)
                reason = f"a drafter model is needed ({models_key} picks a target with its drafter)"
            by_reason.setdefault(reason, []).append(name)
        return "\n".join(f"skipped {', '.join(names)}: {reason}" for reason, names in by_reason.items())


def in_app(reason: str, models_key: str = "Ctrl+O") -> str:
    """An engine refusal with the app's advice instead of the command line's: "needs a drafter
    model: pass --drafter REF (or use pld / --drafter ngram)" points to the model picker and the
    palette's drafter entry."""
    head, needs, _ = reason.partition("needs a drafter model")
    if needs:
        return f"{head}{needs}: {models_key} picks a target with its drafter (or use pld / Drafter: ngram)"
    # the other refusals name command-line flags ("--verify greedy needs temperature 0"): the
    # palette's entries instead, which is where the app changes them
    reason = reason.replace("(--drafter REF)", f"({models_key} picks a target with its drafter)")
    reason = reason.replace("(--drafter REF or ngram)", f"({models_key} picks a target with its drafter, or Drafter: ngram)")
    reason = reason.replace("(:auto)", "(Draft length: auto)")
    for flag, entry in _FLAG_ENTRIES.items():
        reason = re.sub(rf"{flag} (\w+)", rf"{entry}: \1", reason)
    return reason


_FLAG_ENTRIES = {"--verify": "Verifier", "--strategy": "Strategy", "--vocab": "Vocab bridge", "--drafter": "Drafter",
                 "--ssm-tree": "SSM tree", "--backtrack": "Backtrack"}  # command-line flag -> palette group


def next_preset(current: Strategy, has_drafter: bool, cycle: tuple[str, ...] = CYCLE, auto: bool | None = None) -> CycleResult:
    """The next preset after ``current`` in ``cycle`` that validates for this session.

    The sampling knobs (``Strategy.sampling``) and an adaptive draft length (where the next
    preset has one) carry over; everything else comes from the preset. ``auto``: whether the chain
    presets get the cost-aware draft length (default: ``current``'s) — the app keeps it across the
    presets without one (tree, mab...), so a full cycle comes back to ``pld:auto``, not ``pld``.
    Presets that do not validate are skipped, each with its one-line reason.
    """
    start = cycle.index(current.name) if current.name in cycle else -1
    auto = current.adaptive if auto is None else auto
    skipped: list[str] = []
    for offset in range(1, len(cycle) + 1):
        name = cycle[(start + offset) % len(cycle)]
        if name == current.name:
            break  # came back round: nothing else is usable
        try:
            candidate = preset(name, **current.sampling, adaptive=auto and name in ADAPTIVE)
            if name == "ersd" and not has_drafter:
                # exponential races are lossless with any drafter: use n-gram drafts (shown in the label)
                candidate = candidate.replace(drafter="ngram")
            candidate = candidate.validate(has_drafter_model=has_drafter)
        except ValueError as exc:  # StrategyError (a ValueError), or a bad tree shape
            skipped.append(f"skipped {name}: {exc}")
            continue
        return CycleResult(candidate, skipped)
    return CycleResult(None, skipped)
