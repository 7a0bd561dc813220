"""Command palette (ctrl+p) entries for every live toggle of the decode loop (and five actions:
re-measure the speedup's baseline, export the chat as Markdown, edit the last message, the system
prompt, continue the last reply).

Each entry is a change to the session's Strategy (engine.strategy): preset, drafter, tree shape
and policy knobs, verifier, vocabulary bridge, SSM tree mode, backtrack mode, temperature, the
sampling cuts (top-p, top-k, min-p) and the repeat penalty. The loop reads the strategy once per
step, so a change applies at the next step of the reply in flight. Entries whose result does not validate (or, on a
Transformer target, the SSM tree and backtrack modes, which are for SSM and hybrid targets) stay
listed, dimmed, with the reason; choosing one explains instead of applying (the palette cannot
grey items out itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from rich.text import Text
from textual.command import DiscoveryHit, Hit, Hits, Provider

from engine.strategy import ADAPTIVE, BACKTRACK_MODES, SSM_TREE_MODES, STRATEGIES, VERIFIERS, VOCAB_BRIDGES, Strategy, preset
from engine.session import strategy_label

from .keys import app_keys
from .strategy_cycle import in_app

TREE_SHAPES = ((3, 2, 2, 1, 1), (3, 3, 2, 1), (2, 2, 2, 1, 1, 1), (2, 2, 2), (4, 2, 1))
DRAFT_LENGTHS = (2, 3, 4, 5, 6, 8)
TEMPERATURES = (0.0, 0.7, 1.0)
TOP_PS = (1.0, 0.95, 0.9)  # the sampling cuts (engine/sampling.probs_from_logits): 1.0 / 0 = off
TOP_KS = (0, 20, 40, 100)
MIN_PS = (0.0, 0.05, 0.1)
REPEAT_PENALTIES = (1.0, 1.1, 1.2, 1.3)  # over the last Strategy.repeat_last_n tokens; greedy too
NODE_BUDGETS = (8, 16, 32)
MEASURE = "Measure plain-decoding baseline (speedup reference)"
EXPORT = "Export this chat as Markdown"
EDIT = "Edit the last message"
EDIT_HELP = "into the prompt; Enter replaces it and its reply, Esc cancels"
CONTINUE = "Continue the last reply"
CONTINUE_HELP = "the model goes on from where its last reply stopped (the token limit, or Esc)"
SYSTEM = "System prompt…"
SYSTEM_HELP = "what the model reads before this chat (and, ticked, new chats)"
EXPORT_HELP = "to exports/ beside the chat database"
# Target families without SSM layers (engine/models: CausalLM.family): the SSM tree and backtrack
# modes are for SSM and hybrid targets; a Transformer's KV cache verifies a tree and keeps the
# accepted rows as they are (the modes would only repeat work there). Unknown families are not dimmed.
TRANSFORMER_FAMILIES = ("llama", "gpt_neox")
SSM_ONLY = {"SSM tree": "ssm_tree", "Backtrack": "backtrack"}  # palette group -> Strategy field
_DEFAULTS = {f.name: f.default for f in fields(Strategy)}


@dataclass(frozen=True)
class Toggle:
    """One palette entry: its label and how it changes the current strategy."""

    group: str
    value: str
    change: Callable[[Strategy], Strategy]
    help: str = ""

    @property
    def label(self) -> str:
        return f"{self.group}: {self.value}"


def _carry(current: Strategy, name: str) -> Strategy:
    """A preset with the sampling knobs carried over (as the ctrl+s cycle does); ersd keeps n-gram
    drafts the user picked ("Drafter: ngram" on sd or tree), not pld's, which are pld itself (ersd
    from pld raced n-gram drafts with a drafter model loaded). :func:`evaluate` gives ersd n-gram
    drafts where no drafter model is loaded, as the cycle does."""
    s = preset(name, **current.sampling, adaptive=current.adaptive and name in ADAPTIVE)
    if current.drafter == "ngram" and current.name != "pld" and s.drafter == "model" and name in ("ersd",):
        s = s.replace(drafter="ngram")
    return s


def _as(current: Strategy, name: str) -> Strategy:
    """``current`` if it is the ``name`` strategy already, else that preset with the sampling knobs
    carried (a tree shape picked while on ``ar`` is a tree with the drafter model, not ``ar``'s
    settings renamed: that was refused as "needs a drafter" with a drafter loaded)."""
    return current if current.name == name else _carry(current, name)


def toggles() -> list[Toggle]:
    out: list[Toggle] = []
    for name in STRATEGIES:
        out.append(Toggle("Strategy", name, lambda s, n=name: _carry(s, n), "switch the decoding strategy preset"))
    for kind in ("model", "ngram"):
        out.append(Toggle("Drafter", kind, lambda s, k=kind: s.replace(drafter=k), "draft with the drafter model or n-gram lookup"))
    for shape in TREE_SHAPES:
        label = ",".join(map(str, shape))
        out.append(Toggle("Tree shape", label, lambda s, t=shape: _as(s, "tree").replace(tree=t), "static tree (N1..Ngamma)"))
    for k in DRAFT_LENGTHS:
        out.append(Toggle("Draft length", str(k), lambda s, k=k: s.replace(draft_len=k, adaptive=False), "chain length for sd / pld / ersd"))
    out.append(Toggle("Draft length", "auto", lambda s: s.replace(adaptive=s.name in ADAPTIVE),
                      "sd / pld / hybrid: each step drafts the length that pays, from the measured verify cost and recent acceptance"))
    for b in NODE_BUDGETS:
        out.append(Toggle("Optimal tree budget", str(b), lambda s, b=b: _as(s, "optimal").replace(node_budget=b),
                          "exponential-races Alg. 3 tree of at most this many nodes"))
    for v in VERIFIERS:
        out.append(Toggle("Verifier", v, lambda s, v=v: s.replace(verify=v), "how drafts are accepted"))
    for v in VOCAB_BRIDGES:
        out.append(Toggle("Vocab bridge", v, lambda s, v=v: s.replace(vocab=v), "drafters with another vocabulary"))
    for m in SSM_TREE_MODES:
        out.append(Toggle("SSM tree", m, lambda s, m=m: s.replace(ssm_tree=m), "how SSM targets verify a tree"))
    for m in BACKTRACK_MODES:
        out.append(Toggle("Backtrack", m, lambda s, m=m: s.replace(backtrack=m), "how SSM targets commit the accepted path"))
    for t in TEMPERATURES:
        out.append(Toggle("Temperature", f"{t:g}", lambda s, t=t: s.replace(temperature=t), "0 = greedy"))
    for p in TOP_PS:
        out.append(Toggle("Top-p", f"{p:g}", lambda s, p=p: s.replace(top_p=p), "sampling: the most likely tokens holding this mass (1 = off)"))
    for k in TOP_KS:
        out.append(Toggle("Top-k", str(k), lambda s, k=k: s.replace(top_k=k), "sampling: the k most likely tokens only (0 = off)"))
    for p in MIN_PS:
        out.append(Toggle("Min-p", f"{p:g}", lambda s, p=p: s.replace(min_p=p),
                          "sampling: tokens at least this share of the top one's probability (0 = off)"))
    for r in REPEAT_PENALTIES:
        out.append(Toggle("Repeat penalty", f"{r:g}", lambda s, r=r: s.replace(repeat_penalty=r),
                          "recent tokens' logits divided by this (1 = off; greedy decoding too)"))
    return out


def target_family(session: Any) -> str | None:
    """The session's target family ("llama", "mamba2"...: ``engine.models`` CausalLM.family), or
    None where the session does not say (a test's fake engine)."""
    family = getattr(getattr(getattr(session, "target", None), "model", None), "family", None)
    return family if isinstance(family, str) else None


CUTS = {"Top-p": ("top_p", 1.0), "Top-k": ("top_k", 0), "Min-p": ("min_p", 0.0)}  # palette group -> (field, off)
CHAINS = ("sd", "pld", "ersd", "hybrid")  # the strategies a draft length applies to (the others draft a shape or nothing)


def inert(toggle: Toggle, current: Strategy) -> str | None:
    """Why ``toggle`` would change nothing the ``current`` strategy does (a setting it does not
    read), or None: such an entry is refused with the reason instead of accepted and marked
    current while nothing changes."""
    name = current.name
    if toggle.group == "Draft length":
        if name == "ar":
            return "plain decoding (ar) drafts nothing"
        if name not in CHAINS:
            return f"{name} drafts a tree whose shape sets its size (Tree shape, Optimal tree budget); a draft length is for {', '.join(CHAINS)}"
        if toggle.value == "auto" and name not in ADAPTIVE:
            return f"an adaptive draft length is for {', '.join(sorted(ADAPTIVE))}, not {name}"
    if toggle.group == "Drafter":
        if name == "ar":
            return "plain decoding (ar) drafts nothing"
        if name == "pld":
            return "pld drafts by prompt lookup (n-grams) by definition; sd, tree and ersd take either drafter"
    cut = CUTS.get(toggle.group)
    if cut is not None and current.greedy:
        field, off = cut
        if getattr(toggle.change(current), field) == off != getattr(current, field):
            return None  # the way back to off, for a cut left over from sampling (not shown at T = 0)
        return "greedy decoding (Temperature: 0) reads no sampling cuts: they apply from a Temperature above 0"
    return None


def evaluate(toggle: Toggle, current: Strategy, has_drafter: bool,
             family: str | None = None, auto: bool | None = None) -> tuple[Strategy | None, str | None]:
    """(new strategy, None) if the toggle applies here, else (None, the one-line reason).
    ``family``: the target's (:func:`target_family`); on a Transformer the SSM-only modes are
    refused, except the way back to the default where another mode was set (``--backtrack joint``).
    ``auto``: whether a chain preset picked from a strategy without a draft length (tree, mab,
    optimal, ar, ersd) gets the cost-aware one: the app's remembered choice, which Ctrl+S follows
    too (the palette gave ``sd`` from ``tree`` a fixed length where Ctrl+S gave ``sd:auto``)."""
    field = SSM_ONLY.get(toggle.group)
    if field is not None and family in TRANSFORMER_FAMILIES:
        back_to_default = toggle.value == _DEFAULTS[field] != getattr(current, field)
        if not back_to_default:
            what, why = (("SSM tree modes", "attention verifies the tree as it is") if field == "ssm_tree" else
                         ("backtrack modes", "its KV cache keeps the accepted rows as they are"))
            return None, f"{what} are for SSM and hybrid targets; this {family} target is a Transformer ({why})"
    if (why := inert(toggle, current)) is not None:
        return None, why
    try:
        base = current
        if toggle.group == "Strategy" and auto is not None and current.name not in ADAPTIVE:
            base = current.replace(adaptive=auto)  # only read by _carry: the preset's own draft length
        new = toggle.change(base)
        if toggle.group == "Strategy" and new.name == "ersd" and new.drafter == "model" and not has_drafter:
            # exponential races are lossless with any drafter: n-gram drafts, as Ctrl+S picks it
            # (the palette refused ersd for want of a drafter model the cycle did without)
            new = new.replace(drafter="ngram")
        if new.verify not in ("auto",) and toggle.group not in ("Verifier",) and new.name != current.name:
            new = new.replace(verify="auto")  # a new preset picks its own verifier
        return new.validate(has_drafter_model=has_drafter), None
    except ValueError as exc:  # StrategyError or a bad shape
        return None, str(exc)


class StrategyCommands(Provider):
    """Live toggles of the session's strategy (applied at the next step)."""

    def _session(self) -> Any:
        return getattr(self.app, "session", None)

    def _apply(self, toggle: Toggle) -> None:
        session = self._session()
        if session is None:
            self.app.notify("No model loaded yet.", severity="warning")
            return
        new, reason = evaluate(toggle, session.strategy, session.has_drafter, target_family(session), self._auto())
        if new is None:
            self.app.notify(f"{toggle.label} is unavailable: {self._advice(reason)}", severity="warning", timeout=8)
            return
        session.strategy = new
        if new.name in ADAPTIVE and isinstance(getattr(self.app, "cycle_auto", None), bool):
            self.app.cycle_auto = new.adaptive  # what Ctrl+S and the next palette preset keep
        show = getattr(getattr(self.app, "chat", None), "show_strategy", None)
        if show is not None:
            show()
        self.app.notify(f"strategy: {strategy_label(session, new)}", timeout=3)

    def _advice(self, reason: str | None) -> str:
        """The refusal with the app's advice (the model picker's key), not the command line's."""
        return in_app(reason or "", app_keys(self, "{models}"))

    def _auto(self) -> bool | None:
        """The app's remembered cost-aware draft length for chain presets (None: the app keeps none)."""
        auto = getattr(self.app, "cycle_auto", None)
        return auto if isinstance(auto, bool) else None

    def _display(self, toggle: Toggle, current: Strategy | None, has_drafter: bool,
                 family: str | None = None) -> tuple[Text, str]:
        if current is None:
            return Text(toggle.label), toggle.help
        new, reason = evaluate(toggle, current, has_drafter, family, self._auto())
        if new is None:
            return Text(toggle.label, style="dim"), f"unavailable: {self._advice(reason)}"
        mark = " (current)" if new == current else ""
        return Text(toggle.label + mark), toggle.help

    def _entries(self) -> list[tuple[Toggle, Text, str]]:
        session = self._session()
        current = session.strategy if session is not None else None
        has = bool(session.has_drafter) if session is not None else False
        family = target_family(session)
        return [(t, *self._display(t, current, has, family)) for t in toggles()]

    def _measure(self) -> None:
        measure = getattr(self.app, "measure_baseline", None)
        if measure is None:
            return
        if measure("on request") is False:  # (it said "Measuring…" and measured nothing)
            what = "No model loaded yet" if self._session() is None else "This engine has no baseline to measure"
            self.app.notify(f"{what}: nothing to measure.", severity="warning", timeout=4)
            return
        self.app.notify("Measuring plain decoding (ar) for the speedup…", timeout=3)

    def _chat_action(self, name: str) -> Callable[[], Any]:
        def run() -> Any:  # the palette awaits what an async action returns (app.call_later)
            action = getattr(getattr(self.app, "chat", None), name, None)
            return action() if action is not None else None
        return run

    def _actions(self) -> list[tuple[str, Callable[[], Any], str]]:
        """The palette's actions besides the toggles: (label, callback, help)."""
        return [(MEASURE, self._measure, "re-measure the speedup's reference on this machine"),
                (EXPORT, self._chat_action("action_export_chat"), EXPORT_HELP),
                (EDIT, self._chat_action("action_edit_last"), EDIT_HELP),
                (SYSTEM, self._chat_action("action_system_prompt"), SYSTEM_HELP),
                (CONTINUE, self._chat_action("action_continue_reply"), CONTINUE_HELP)]

    async def discover(self) -> Hits:
        for toggle, text, help_text in self._entries():
            yield DiscoveryHit(text, lambda t=toggle: self._apply(t), help=help_text)
        for label, run, help_text in self._actions():
            yield DiscoveryHit(label, run, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for label, run, help_text in self._actions():
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), run, help=help_text)
        for toggle, text, help_text in self._entries():
            score = matcher.match(toggle.label)
            if score > 0:
                # a Content (immutable): its methods return the changed copy
                hl = matcher.highlight(toggle.label).append(text.plain[len(toggle.label):])  # " (current)", as discover shows
                if text.style:
                    hl = hl.stylize(str(text.style))  # dim: unavailable here
                yield Hit(score, hl, lambda t=toggle: self._apply(t), help=help_text)
