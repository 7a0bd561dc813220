"""The live dashboard beside the chat: speed, tokens per step, acceptance by depth, memory,
the coloured step view and the draft tree.

The chat screen hands it each drain's StepEvents with :meth:`Dashboard.add_events` (cheap: folds
numbers). Widgets are repainted by the dashboard's own timer, at most :data:`REPAINT_HZ` times a
second and only when something changed; :meth:`flush` repaints at once (end of a reply).
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Sparkline, Static

from engine.events import StepEvent

from ..dashboard_stats import DashboardStats
from ..sysinfo import MemoryMonitor, memory_lines
from .draft_tree import DraftTreeView
from .step_view import StepView

REPAINT_HZ = 10
MEMORY_HZ = 2
BAR_WIDTH = 12


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


def speed_text(stats: DashboardStats) -> Text:
    """tok/s now and averaged, mean tokens per step, the last step's drafted/accepted."""
    out = Text()
    out.append("tok/s ", style="bold")
    out.append(f"now {stats.tokens_per_s_now:.1f} · avg {stats.tokens_per_s_avg:.1f}\n")
    out.append("tok/step ", style="bold")
    out.append(f"{stats.mean_tokens_per_step:.2f} mean accepted length\n")
    ev = stats.last
    if ev is None:
        out.append("last step: —", style="dim")
    else:
        out.append(f"step {ev.step}: ", style="bold")
        out.append(f"drafted {ev.drafted}, accepted {ev.accepted} · {ev.strategy}")
    return out


class Dashboard(VerticalScroll, can_focus=False):
    """Panel of live metrics for the reply in flight (it keeps the last reply's once done)."""

    def __init__(self, monitor: MemoryMonitor | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.stats = DashboardStats()
        self.monitor = monitor
        self.repaints = 0  # how many times the widgets were redrawn (tests bound it)
        self._dirty = False

    def compose(self) -> ComposeResult:
        yield Static(id="dash-speed")
        yield Static("tokens per step", classes="dash-title")
        yield Sparkline([], id="dash-spark")
        yield Static("acceptance by depth", classes="dash-title")
        yield Static(id="dash-depth")
        yield Static(id="dash-memory")
        yield Static("steps  (accepted · target)", classes="dash-title")
        yield StepView(id="dash-steps")
        yield Static("draft tree  ([ / ] step, when focused)", classes="dash-title")
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
        self._dirty = True

    def add_events(self, events: Iterable[StepEvent]) -> None:
        """Fold one drain's events in; the repaint waits for the next tick."""
        for ev in events:
            self.stats.add(ev)
            self._dirty = True

    def flush(self) -> None:
        """Repaint now if anything changed (the reply just ended, or the panel was shown)."""
        if self._dirty:
            self._paint()

    # ---- painting --------------------------------------------------------------------------------
    def _tick(self) -> None:
        if self._dirty and self.display:
            self._paint()

    def _paint(self) -> None:
        self._dirty = False
        self.repaints += 1
        stats = self.stats
        self.query_one("#dash-speed", Static).update(speed_text(stats))
        self.query_one("#dash-spark", Sparkline).data = list(stats.per_step)
        self.query_one("#dash-depth", Static).update(depth_bars(stats.acceptance_by_depth()))
        events = list(stats.events)
        self.query_one(StepView).show(events)
        self.query_one(DraftTreeView).show(events)

    def _sample_memory(self) -> None:
        if self.monitor is None or not self.display:
            return
        self.query_one("#dash-memory", Static).update("\n".join(memory_lines(self.monitor.read())))
