"""The status line: model and strategy on top; last step, speed and state below."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widget import Widget

from engine.events import GenerationSummary, StepEvent

FINISH_TEXT = {
    "eos": "done · eos",
    "length": "done · length",
    "stopped": "stopped",
    "context": "context full",
    "error": "error",
}


@dataclass
class StatusState:
    """Everything the status line shows. The owner changes fields, then calls ``refresh()``."""

    model: str = "Loading model…"
    strategy: str = ""
    state: str = "loading"
    last_event: StepEvent | None = None  # the last step (a bookkeeping event only where no step came: step_text)
    summary: GenerationSummary | None = None

    def step_text(self) -> str:
        """``step 12: drafted 5, accepted 3 · 41.2 tok/s · 3.10 tok/step`` (empty before a step)."""
        ev = self.last_event
        if ev is None:
            return ""
        if not ev.emitted:  # a bookkeeping event: its number is the last step's, its counts are not
            if ev.step <= 0:  # Esc during the prefill: there was no step 0
                return ""
            parts = [f"step {ev.step}"]
        else:
            parts = [f"step {ev.step}: drafted {ev.drafted}, accepted {ev.accepted}"]
        if self.summary is not None and self.summary.steps:
            parts.append(f"{self.summary.tokens_per_s:.1f} tok/s")
            parts.append(f"{self.summary.mean_accepted:.2f} tok/step")
        return " · ".join(parts)


def fit(left: str, right: str, width: int, parts: str | None = None) -> str:
    """``left`` and ``right`` on one line of ``width`` cells; ``left`` is cut with an ellipsis, or,
    given the separator of its ``parts``, loses whole parts from the end (a number is never cut
    in two: "26.2 tok/…" read as a figure)."""
    room = width - len(right) - (1 if right else 0)
    if room <= 0:
        return right[:width]
    if len(left) > room and parts:
        pieces = left.split(parts)
        while pieces and len(parts.join(pieces)) + 2 > room:
            pieces.pop()
        left = parts.join(pieces) + " …" if pieces else ""
    if len(left) > room:
        left = left[: max(room - 1, 0)] + "…"
    return left.ljust(room) + (" " + right if right else "")


class StatusLine(Widget):
    """Two lines at the bottom of the chat. Safe to update before it is mounted."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.status = StatusState()

    def lines(self, width: int | None = None) -> tuple[str, str]:
        """The two lines as plain text (``width`` None: no fitting)."""
        s = self.status
        if width is None:
            return f"{s.model} {s.strategy}".strip(), f"{s.step_text()} {s.state}".strip()
        return fit(s.model, s.strategy, width), fit(s.step_text(), s.state, width, parts=" · ")

    def render(self) -> Text:
        top, bottom = self.lines(self.content_region.width or self.size.width)
        text = Text(no_wrap=True, overflow="ellipsis")
        strategy = self.status.strategy
        if strategy and top.endswith(strategy):
            text.append(top[: len(top) - len(strategy)])
            text.append(strategy, style="bold")
        else:
            text.append(top)
        text.append("\n")
        text.append(bottom)
        return text
