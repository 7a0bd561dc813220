"""Command palette toggles (app/commands.py): every knob is an entry; invalid ones explain why."""

from __future__ import annotations

import pytest

from textual.app import App

from app.commands import NODE_BUDGETS, StrategyCommands, evaluate, toggles
from engine.strategy import STRATEGIES, preset

from .fakes import FakeEngine


def _find(group: str, value: str):
    return next(t for t in toggles() if t.group == group and t.value == value)


def test_every_knob_has_entries():
    groups = {t.group for t in toggles()}
    assert groups == {"Strategy", "Drafter", "Tree shape", "Draft length", "Optimal tree budget", "Verifier", "Vocab bridge",
                      "SSM tree", "Backtrack", "Temperature", "Top-p", "Top-k", "Min-p",
                      "Repeat penalty"}
    assert {t.value for t in toggles() if t.group == "Strategy"} == set(STRATEGIES)


def test_evaluate_applies_valid_changes_and_explains_invalid_ones():
    sd = preset("sd")
    new, why = evaluate(_find("Tree shape", "3,3,2,1"), sd, has_drafter=True)
    assert why is None and new.name == "tree" and new.tree == (3, 3, 2, 1)
    new, why = evaluate(_find("Strategy", "mab"), sd, has_drafter=False)
    assert new is None and "needs a drafter model" in why
    new, why = evaluate(_find("Verifier", "greedy"), sd.replace(temperature=0.7), has_drafter=True)
    assert new is None and "temperature 0" in why
    new, why = evaluate(_find("Temperature", "0.7"), sd, has_drafter=True)
    assert why is None and new.temperature == 0.7 and new.name == "sd"
    # switching preset from ersd (race) to tree resets the verifier to the preset's own
    new, why = evaluate(_find("Tree shape", "2,2,2"), preset("ersd"), has_drafter=True)
    assert why is None and new.resolved_verify() == "greedy"
    # from ar (no drafter in its settings) a tree shape or an optimal budget takes that preset: with a
    # drafter model loaded it applies (it was refused as "needs a drafter")
    for toggle, name in ((_find("Tree shape", "2,2,2"), "tree"), (_find("Optimal tree budget", str(NODE_BUDGETS[0])), "optimal")):
        new, why = evaluate(toggle, preset("ar", temperature=0.5), has_drafter=True)
        assert why is None and new.name == name and new.drafter == "model" and new.temperature == 0.5, why
    new, why = evaluate(_find("Tree shape", "2,2,2"), preset("tree"), has_drafter=True)
    assert why is None and new == preset("tree").replace(tree=(2, 2, 2))
    new, why = evaluate(_find("Backtrack", "joint"), sd, has_drafter=True)
    assert why is None and new.backtrack == "joint"


class PaletteApp(App[None]):
    COMMANDS = {StrategyCommands}

    def __init__(self, engine: FakeEngine) -> None:
        super().__init__()
        self.session = engine
        self.shown = 0

    class _Chat:
        def __init__(self, app: "PaletteApp") -> None:
            self.app = app

        def show_strategy(self) -> None:
            self.app.shown += 1

    @property
    def chat(self):
        return PaletteApp._Chat(self)


async def _run_palette(app: PaletteApp, query: str) -> None:
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*query)
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.2)


async def test_palette_switches_the_strategy_live():
    engine = FakeEngine()
    app = PaletteApp(engine)
    await _run_palette(app, "Tree shape: 3,3,2,1")
    assert engine.strategy.name == "tree" and engine.strategy.tree == (3, 3, 2, 1)
    assert app.shown == 1


async def test_palette_refuses_an_invalid_entry_with_its_reason():
    engine = FakeEngine(has_drafter=False, strategy=preset("pld"))
    app = PaletteApp(engine)
    notes: list[str] = []
    app.notify = lambda message, **kw: notes.append(message)  # type: ignore[method-assign]
    await _run_palette(app, "Strategy: mab")
    assert engine.strategy == preset("pld")
    assert any("unavailable" in n and "needs a drafter model" in n for n in notes)


def test_draft_length_auto_toggles_the_cost_gate_and_carries_over():
    new, why = evaluate(_find("Draft length", "auto"), preset("pld"), has_drafter=True)
    assert why is None and new.adaptive and "auto" in new.label()
    new, why = evaluate(_find("Strategy", "sd"), new, has_drafter=True)  # carried to the next chain preset
    assert why is None and new.name == "sd" and new.adaptive
    new, why = evaluate(_find("Draft length", "3"), new, has_drafter=True)  # a number fixes the length again
    assert why is None and not new.adaptive and new.draft_len == 3
    new, why = evaluate(_find("Draft length", "auto"), preset("tree"), has_drafter=True)
    assert new is None and "shape sets its size" in why  # trees have their own policies: refused, not a silent no-op


@pytest.mark.parametrize("group, value, strategy, says", [
    ("Draft length", "3", "tree", "a draft length is for sd, pld, ersd, hybrid"),
    ("Draft length", "3", "mab", "a draft length is for sd, pld, ersd, hybrid"),
    ("Draft length", "3", "ar", "drafts nothing"),
    ("Draft length", "auto", "ersd", "an adaptive draft length is for"),
    ("Drafter", "model", "pld", "prompt lookup"),
    ("Drafter", "ngram", "ar", "drafts nothing"),
])
def test_toggles_a_strategy_does_not_read_are_refused_with_the_reason(group, value, strategy, says):
    """A setting the current strategy does not read (a draft length on a tree, a drafter on pld) was
    accepted and then marked "(current)" while nothing changed: now dimmed with the reason."""
    new, why = evaluate(_find(group, value), preset(strategy), has_drafter=True)
    assert new is None and says in why
    new, why = evaluate(_find(group, value if group == "Drafter" else "4"), preset("sd"), has_drafter=True)
    assert why is None  # sd reads both


def test_ssm_modes_are_dimmed_on_a_transformer_target():
    """SSM tree and backtrack modes are for SSM and hybrid targets: on a llama (Transformer) target
    they are refused with the reason (they were "applied" and did nothing useful); the way back to
    the default from a mode set on the command line stays open; SSM targets and unknown families
    (a fake engine) keep them."""
    sd = preset("sd")
    for group, value in (("SSM tree", "unrolled"), ("SSM tree", "stree"), ("Backtrack", "joint"), ("Backtrack", "replay")):
        new, why = evaluate(_find(group, value), sd, has_drafter=True, family="llama")
        assert new is None and "SSM and hybrid targets" in why and "llama target is a Transformer" in why, (group, value)
        for family in ("mamba2", "granitemoehybrid", None):
            new, why = evaluate(_find(group, value), sd, has_drafter=True, family=family)
            assert why is None and new is not None
    new, why = evaluate(_find("Backtrack", "replay"), sd.replace(backtrack="joint"), has_drafter=True, family="llama")
    assert why is None and new.backtrack == "replay"
    new, why = evaluate(_find("Temperature", "0.7"), sd, has_drafter=True, family="llama")
    assert why is None and new.temperature == 0.7


def _llama_engine(**kwargs) -> FakeEngine:
    from types import SimpleNamespace

    engine = FakeEngine(**kwargs)
    engine.target = SimpleNamespace(model=SimpleNamespace(family="llama"))  # type: ignore[attr-defined]
    return engine


async def test_palette_dims_ssm_modes_on_a_transformer_and_refuses_them():
    engine = _llama_engine()
    app = PaletteApp(engine)
    notes: list[str] = []
    app.notify = lambda message, **kw: notes.append(message)  # type: ignore[method-assign]
    async with app.run_test(size=(100, 30)) as pilot:
        entries = {t.label: (text, help_text) for t, text, help_text in StrategyCommands(app.screen)._entries()}
        text, help_text = entries["Backtrack: joint"]
        assert text.style == "dim" and help_text.startswith("unavailable: backtrack modes are for SSM and hybrid targets")
        assert entries["SSM tree: unrolled"][0].style == "dim"
        assert entries["Verifier: greedy"][0].style != "dim"
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Backtrack: joint")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.2)
    assert engine.strategy == preset("sd") and app.shown == 0
    assert any("Backtrack: joint is unavailable" in n and "Transformer" in n for n in notes)


async def test_palette_refusals_give_the_apps_advice_not_the_command_lines():
    """Without a drafter model the reason points to the model picker (and the palette's n-gram
    drafter), not to --drafter REF."""
    engine = FakeEngine(has_drafter=False, strategy=preset("ar"))
    app = PaletteApp(engine)
    notes: list[str] = []
    app.notify = lambda message, **kw: notes.append(message)  # type: ignore[method-assign]
    await _run_palette(app, "Tree shape: 2,2,2")
    assert engine.strategy == preset("ar")
    note = next(n for n in notes if "unavailable" in n)
    assert "needs a drafter model: Ctrl+O picks a target with its drafter" in note and "--drafter" not in note


async def test_palette_search_keeps_the_current_mark_and_the_dimming():
    """Typing in the palette ("strategy") still marks the entry in force "(current)" and dims the
    unavailable ones, as the list shown before any typing does (the search showed every entry
    bare and undimmed: nothing said which one ran, nor which would be refused)."""
    engine = FakeEngine(strategy=preset("pld"), has_drafter=False)
    app = PaletteApp(engine)
    async with app.run_test(size=(100, 30)):
        provider = StrategyCommands(app.screen)
        hits = {str(h.match_display): h.match_display async for h in provider.search("strategy")}
    assert "Strategy: pld (current)" in hits and "Strategy: ar" in hits
    dim = {label for label, content in hits.items()
           if any("dim" in str(span.style) and span.start == 0 and span.end >= len(label) for span in content.spans)}
    assert "Strategy: mab" in dim and "Strategy: tree" in dim  # need a drafter model
    assert "Strategy: ar" not in dim and "Strategy: pld (current)" not in dim
