"""The last steps of the reply, coloured: drafted-and-accepted tokens vs the target's own token."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text

from engine.events import StepEvent

from .fit_static import FitStatic

STEP_VIEW_STEPS = 20
SEGMENT_STYLES = {"accepted": "green", "target": "bold magenta"}


def visible(text: str) -> str:
    """Line breaks shown as ⏎ so the view stays compact."""
    return text.replace("\r", "").replace("\n", "⏎")


def render_steps(events: Iterable[StepEvent]) -> Text:
    """Each step's segments in their kind's style (a step without segments: its text, unstyled)."""
    out = Text()
    for ev in events:
        if ev.segments:
            for text, kind in ev.segments:
                out.append(visible(text), style=SEGMENT_STYLES.get(kind, ""))
        else:
            out.append(visible(ev.text))
    return out


class StepView(FitStatic):
    """The last :data:`STEP_VIEW_STEPS` steps; the Markdown message keeps the full formatted reply."""

    def show(self, events: list[StepEvent]) -> None:
        self.update(render_steps(events[-STEP_VIEW_STEPS:]))
