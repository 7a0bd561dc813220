"""The live dashboard beside the chat: speed, tokens per step, acceptance by depth, memory,
the coloured step view and the draft tree.

The chat screen hands it each drain's StepEvents with :meth:`Dashboard.add_events` (cheap: folds
numbers). While a reply streams the chat repaints it once a frame with :meth:`Dashboard.frame`, in
the same layout and render as the reply's new text; otherwise its own timer repaints it, at most
:data:`REPAINT_HZ` times a second and only when something changed; :meth:`flush` repaints at once
(end of a reply).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.color import Color
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.renderables.sparkline import Sparkline as SparklineRenderable
from textual.widgets import Sparkline, Static

from engine.events import StepEvent

from ..dashboard_stats import DashboardStats
from ..keys import app_keys
from ..sysinfo import MemoryMonitor, memory_lines
from .draft_tree import DraftTreeView
from .fit_static import FitStatic
from .step_view import StepView

if TYPE_CHECKING:  # the annotation only
    from engine.session import Baseline

REPAINT_HZ = 4  # dashboards refresh more slowly than the chat (see screens/chat.py: each repaint costs the decode)
MEMORY_HZ = 2
BAR_WIDTH = 12
TREE_TITLE = "draft tree  ({tree_older} / {tree_newer} step, when focused)"


def depth_bars(rows: list[tuple[int, float]]) -> Text:
    """``≥1 ██████████░░  83%`` per depth (empty: a dim note)."""
    if not rows:
        return Text("no speculative steps yet", style="dim")
    out = Text()
    for i, (d, frac) in enumerate(rows):
        full = round(frac * BAR_WIDTH)
        out.append(f"≥{d:<2} ")
        out.append("█" * full, style="green")
        out.append("░" * (BAR_WIDTH - full), style="dim")
        out.append(f" {100 * frac:3.0f}%" + ("\n" if i < len(rows) - 1 else ""))
    return out


def speed_text(stats: DashboardStats, baseline: "BaselineInfo | None" = None, context_length: int | None = None,
               pending: str | None = None) -> Text:
    """tok/s now and averaged, speedup against the measured plain-decoding baseline (``pending``,
    without one: why there is none, e.g. it is being measured, or could not be), mean tokens per
    step, the prompt's prefill (its new tokens: a chat's cached prefix is reused), how full the
    model's context is (``context_length``: yellow from CONTEXT_WARN on), the last step's
    drafted/accepted."""
    out = Text()
    stepped = stats.summary.steps > 0  # no step (Esc during the prefill, a full context): no rate, no mean
    out.append("tok/s ", style="bold")
    if stepped:
        out.append(f"now {stats.tokens_per_s_now:.1f} · avg {stats.tokens_per_s_avg:.1f}\n")
    else:
        out.append("—\n", style="dim")
    out.append("speedup ", style="bold")
    if baseline is None or baseline.tokens_per_s <= 0:
        out.append(f"— ({pending or 'plain-decoding baseline not measured yet'})\n", style="dim")
    else:
        avg, ref, note = stats.tokens_per_s_avg, baseline.tokens_per_s, baseline.note
        fit, ctx = baseline.fit, stats.mean_context
        at = baseline.context or (fit.context if fit is not None else 0.0)  # the context the reference was measured at
        # (the load-time measure is never moved down: the fit holds a short reply at its short point)
        far = at > 0 and ctx > 0 and (ctx / at > FIT_FROM or (baseline.context > 0 and at / ctx > FIT_FROM))
        if fit is not None and fit.fitted and far:
            # a reply at another context than the reference's (a long conversation; an in-app ar
            # reply at a long context against a short one): plain decoding moved to this reply's
            # context along the fit to the load-time measures
            ref = ref * fit.tokens_per_s_at(ctx) / fit.tokens_per_s_at(at)
            src = f"from ar in the app at ~{at:,.0f} tokens, along a fit" if baseline.context else "fitted"
            note = (f"at this reply's ~{ctx:,.0f}-token context, {src} to ar measured at ~{fit.context:,.0f}"
                    f" and ~{fit.long_context:,.0f} tokens")
        if avg > 0:
            out.append(f"×{avg / ref:.2f} ", style="bold green" if avg >= ref else "bold yellow")
        else:
            out.append("— ", style="dim")
        drew = "" if baseline.sampling == "T=0" else f"{baseline.sampling}; "  # a sampled reply's plain decoding samples too
        out.append(f"vs ar {ref:.1f} tok/s ({drew}{note})\n", style="dim")
    out.append("tok/step ", style="bold")
    if stepped:
        out.append(f"{stats.mean_tokens_per_step:.2f} mean accepted length\n")
    else:
        out.append("—\n", style="dim")
    out.append("prefill ", style="bold")
    if stats.prefill_s > 0:
        rate = f", {stats.prefill_tokens / stats.prefill_s:,.0f} tok/s" if stats.prefill_tokens else ""
        out.append(f"{stats.prefill_tokens:,} new prompt tokens in {stats.prefill_s:.2f} s{rate}\n")
    else:
        out.append("—\n", style="dim")
    ev = stats.last
    if ev is not None and ev.position and context_length:
        used = ev.position / context_length
        out.append("context ", style="bold")
        out.append(f"{ev.position:,} / {context_length:,} tokens ({100 * used:.0f}%)",
                   style="bold yellow" if used >= CONTEXT_WARN else "")
        if stats.dropped_messages:
            out.append(f"\n  {stats.dropped_messages} oldest messages left out to fit", style="dim")
        out.append("\n")
    if ev is None:
        out.append("last step: —", style="dim")
    else:
        out.append(f"step {ev.step}: ", style="bold")
        out.append(f"drafted {ev.drafted}, accepted {ev.accepted} · {ev.strategy}")
    return out


CONTEXT_WARN = 0.8  # the context line turns yellow when the conversation fills this much of the window
FIT_FROM = 2.0  # a reply decoded at this many times the short measure's context uses the fit


@dataclass(frozen=True)
class BaselineInfo:
    """The plain-decoding speed the speedup is measured against, and how it was measured; ``fit``
    (the engine's Baseline, where it measured a long context too) gives that speed at a reply's
    own context."""

    tokens_per_s: float
    note: str  # e.g. "measured at start, 48 tokens"
    fit: "Baseline | None" = None
    context: float = 0.0  # an in-app measure's mean context (0: the load-time one, whose contexts the fit has)
    sampling: str = "T=0"  # how that plain decoding drew its tokens (engine Strategy.sampling_label)


def policy_text(policy: dict | None, bridge: dict | None = None) -> Text:
    """The tree policy's state: bandit arms (mab) or per-rank acceptance (optimal); under it the
    vocabulary bridge's last step when the drafter speaks another vocabulary."""
    out = policy_only_text(policy)
    if bridge:
        out.append(f"\nvocab bridge {bridge.get('bridge')} · {bridge.get('drafted', 0)} drafter tokens → "
                   f"{bridge.get('proposed', 0)} target tokens proposed", style="magenta")
    return out


def _confidence_label(code: float) -> str:
    """A drafted node's confidence (engine/gate.py codes): "copy" (copied from a context match),
    a datastore share "0.45", a drafter model's probability "0.83m", a token both proposed "0.83=". """
    if code < 0:
        return "copy"
    if code >= 4.0:  # gate.AGREE
        return f"{code - 4.0:.2f}="
    if code >= 2.0:  # gate.MODEL
        return f"{code - 2.0:.2f}m"
    return f"{code:.2f}"


def policy_only_text(policy: dict | None) -> Text:
    if not policy:
        return Text("static tree (no policy running)", style="dim")
    out = Text()
    if policy.get("policy") == "gate":  # engine/gate.py: the :auto strategies' draft length
        src = {"ngram": "prompt lookup", "tree": "copy + datastore + drafter"}.get(policy.get("source"), "drafter model")
        out.append(f"draft-length gate · {src}\n", style="bold")
        # a tree cut by its own confidence (pld's lookup trie) can keep more nodes than the chain cap
        k, kmax = policy.get("k", 0), max(policy.get("k_max", 0), policy.get("drafted", 0))
        what = "plain step (a draft would not pay)" if k == 0 else ("probe, 1 token" if policy.get("probe") else f"k = {k} of {kmax}")
        out.append(f"α {policy.get('alpha', 0):.2f} · {what}")
        if "drafter" in policy:  # hybrid:auto's mixed trees: whether the drafter model's cost pays (gate.with_drafter)
            state = "in" if policy["drafter"] else "out"
            out.append(f"\ndrafter model {state} · {policy.get('drafter_ms', 0):.1f} ms a step vs a "
                       f"{policy.get('step_ms', 0):.1f} ms plain step", style="green" if policy["drafter"] else "dim")
        if "drafting" in policy:  # sd:auto: whether running the drafter pays at all, measured (gate.drafting_pays)
            w, wo = policy.get("rates") or (None, None)
            rates = " · ".join(f"{r:.3f} tok/ms {what}" for r, what in ((w, "drafting"), (wo, "plain")) if r is not None)
            state = "drafter runs" if policy["drafting"] else "drafter rests (plain steps pay better now)"
            out.append(f"\n{state}" + (f" · {rates}" if rates else ""), style="green" if policy["drafting"] else "dim")
        conf = policy.get("confidence")
        if conf:  # a drafter chain cut by its own confidence: p of each drafted token, the kept ones bold
            out.append(f"\ndrafted {len(conf)} · p ")
            for i, p in enumerate(conf):
                out.append(_confidence_label(p) + " ", style="bold green" if i < k else "dim")
            out.append(f"· E {policy.get('expected', 1.0):.2f} tokens")
        return out
    if policy.get("policy") == "mixed chain":  # hybrid:K with a datastore: each token from the likeliest source
        by = ("the drafter's chain scorer" + (f" (fitted on {Path(str(policy['fitted_on'])).name})" if policy.get("fitted_on") else "")
              if policy.get("ranked_by") == "scorer" else "the gate's calibration")
        out.append("mixed chain · copy / datastore / drafter\n", style="bold")
        out.append(f"ranked by {by}\n")
        conf, acc = policy.get("confidence", []), policy.get("accepted", 0)
        out.append("sources ")
        for i, c in enumerate(conf):  # what each node's token came from (m: the drafter, =: two agreed), accepted bold
            out.append(_confidence_label(c) + " ", style="bold green" if i < acc else "dim")
        return out
    if policy.get("policy") == "mab":
        out.append(f"UCB bandit · round {policy['rounds']} · λγ {policy['lambda_gamma']:.2f}\n", style="bold")
        chosen = policy.get("chosen")
        arms = policy.get("arms", [])
        for i, a in enumerate(arms):
            mark = "▶ " if a["shape"] == chosen else "  "
            out.append(mark + ",".join(map(str, a["shape"])).ljust(12), style="bold cyan" if mark.strip() else "")
            out.append(f" n={a['count']:<4} r̄={a['mean']:+.3f}" + ("\n" if i < len(arms) - 1 else ""))
    else:
        ranks = " ".join(f"{r:.2f}" for r in policy.get("rank_acceptance", []))
        out.append(f"optimal tree · {policy.get('nodes', 0)} nodes (budget {policy.get('budget', 0)}), depth {policy.get('depth', 0)}\n",
                   style="bold")
        out.append(f"P(accept) by child rank: {ranks}")
    return out


SPARK_TITLE = "tokens per step"


def spark_title(per_step: Iterable[int]) -> str:
    """The sparkline's title with its scale: a full bar is the reply's most tokens in one step."""
    top = max(per_step, default=0)
    return f"{SPARK_TITLE}  (full bar = {top})" if top else SPARK_TITLE


def step_columns(data: list[int], width: int) -> list[int]:
    """One column a step, or the most of each run of steps once they outnumber ``width``: the steps
    split into ``width`` contiguous groups as evenly as integers allow (sizes differ by at most one)."""
    n = len(data)
    if n <= width:
        return list(data)
    return [max(data[i * n // width:(i + 1) * n // width]) for i in range(width)]


def blend(low: Color, high: Color, ratio: float) -> Color:
    """The colour ``ratio`` of the way from ``low`` to ``high`` in RGB (``high`` where either has no RGB
    form, as a named terminal colour)."""
    if low.triplet is None or high.triplet is None:
        return high
    (r1, g1, b1), (r2, g2, b2) = low.triplet, high.triplet
    return Color.from_rgb(r1 + (r2 - r1) * ratio, g1 + (g2 - g1) * ratio, b1 + (b2 - b1) * ratio)


class StepBars(SparklineRenderable):  # type: ignore[type-arg]
    """Tokens per step as bars from 0 up to the reply's most, one column a step (the steps of a
    column each, at most, once they outnumber the columns). Textual's sparkline scales from the
    data's least to its most and stretches few values over the width: a one-step reply filled the
    panel with one full-height block, and a reply emitting 4 tokens every step drew the same flat
    line as plain decoding's 1."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = self.width or options.max_width
        height = self.height or 1
        data = list(self.data)
        top = max(data, default=0)
        if top <= 0:
            yield from super().__rich_console__(console, options)
            return
        columns = step_columns(data, width)  # (our own: Textual's bucketing and blending are private)
        levels = len(self.BARS)
        low, high = self.min_color.color, self.max_color.color
        assert low is not None and high is not None
        for row in reversed(range(height)):
            for value in columns:
                ratio = value / top
                eighths = max(1, round(ratio * levels * height))  # a step's bar shows, however short
                filled = eighths - row * levels
                if filled <= 0:
                    yield Segment(" ")
                else:
                    yield Segment(self.BARS[min(filled, levels) - 1], Style.from_color(blend(low, high, ratio)))
            if len(columns) < width:
                yield Segment(" " * (width - len(columns)))
            if row:
                yield Segment.line()


class StepSparkline(Sparkline):
    """The dashboard's tokens per step (:class:`StepBars`)."""

    def render(self) -> StepBars:
        r = super().render()
        assert isinstance(r, SparklineRenderable)
        return StepBars(r.data, width=r.width, height=r.height, min_color=r.min_color.color,  # type: ignore[arg-type]
                        max_color=r.max_color.color, summary_function=r.summary_function)  # type: ignore[arg-type]


class Dashboard(VerticalScroll, can_focus=False):
    """Panel of live metrics for the reply in flight (it keeps the last reply's once done)."""

    def __init__(self, monitor: MemoryMonitor | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.stats = DashboardStats()
        self.baseline: BaselineInfo | None = None
        self.baseline_pending: str | None = None  # without a baseline: why (being measured, or failed)
        self.monitor = monitor
        self.repaints = 0  # how many times the widgets were redrawn (tests bound it)
        self.context_length: int | None = None  # the session's context window (tokens), for the context line
        self._dirty = False

    def compose(self) -> ComposeResult:
        yield FitStatic(id="dash-speed")
        yield Static(SPARK_TITLE, id="dash-spark-title", classes="dash-title")
        yield StepSparkline([], id="dash-spark")
        yield Static("acceptance by depth", classes="dash-title")
        yield FitStatic(id="dash-depth")
        yield Static("tree policy", classes="dash-title")
        yield FitStatic(id="dash-policy")
        yield FitStatic(id="dash-memory")
        yield Static("steps  (accepted · target)", classes="dash-title")
        yield StepView(id="dash-steps")
        yield Static(app_keys(self, TREE_TITLE), classes="dash-title")  # the keys the user's keymap gives
        yield DraftTreeView(id="dash-tree")

    def on_mount(self) -> None:
        if self.monitor is None:
            self.monitor = MemoryMonitor()
        self._paint()
        self._sample_memory()
        self.set_interval(1 / REPAINT_HZ, self._tick)
        self.set_interval(1 / MEMORY_HZ, self._sample_memory)

    # ---- feeding ---------------------------------------------------------------------------------
    def start_reply(self) -> None:
        """A new reply: forget the previous one's numbers and steps."""
        self.stats = DashboardStats()
        self.query_one(DraftTreeView).index = None
        for w in self.query(FitStatic):  # each section back to its content's height
            w.reset_fit()
        self._dirty = True

    def add_events(self, events: Iterable[StepEvent]) -> None:
        """Fold one drain's events in; the repaint waits for the next tick."""
        for ev in events:
            self.stats.add(ev)
            self._dirty = True

    def set_baseline(self, baseline: BaselineInfo | None, pending: str | None = None) -> None:
        """The measured plain-decoding speed, or None and ``pending``: why there is none (it is
        being measured, or could not be: the two said the same "not measured yet" before)."""
        self.baseline, self.baseline_pending = baseline, (pending if baseline is None else None)
        self._dirty = True

    def flush(self) -> None:
        """Repaint now if anything changed (the reply just ended, or the panel was shown)."""
        if self._dirty:
            self._paint()

    def frame(self) -> None:
        """The chat's streaming frame: repaint now, if shown and anything changed, so the panel
        is laid out and rendered with the reply's new text rather than on a timer of its own."""
        if self._dirty and self.display:
            self._paint()

    # ---- painting --------------------------------------------------------------------------------
    def _tick(self) -> None:
        self.frame()

    def _paint(self) -> None:
        self._dirty = False
        self.repaints += 1
        stats = self.stats
        self.query_one("#dash-speed", Static).update(speed_text(stats, self.baseline, self.context_length, self.baseline_pending))
        last = stats.last
        self.query_one("#dash-policy", Static).update(policy_text(last.policy if last else None, getattr(last, "bridge", None) if last else None))
        self.query_one("#dash-spark", Sparkline).data = list(stats.per_step)
        self.query_one("#dash-spark-title", Static).update(spark_title(stats.per_step))
        self.query_one("#dash-depth", Static).update(depth_bars(stats.acceptance_by_depth()))
        events = list(stats.events)
        self.query_one(StepView).show(events)
        self.query_one(DraftTreeView).show(events)

    def _sample_memory(self) -> None:
        if self.monitor is None or not self.display:
            return
        last = self.stats.last
        torch_gpu = last.gpu_mb if last is not None else None
        self.query_one("#dash-memory", Static).update("\n".join(memory_lines(self.monitor.read(), torch_gpu)))
