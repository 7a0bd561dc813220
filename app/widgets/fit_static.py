"""A Static whose updates reflow the screen only when it must grow.

Textual's ``Static.update`` asks for a layout pass by default, and a layout pass arranges the
whole screen: the dashboard's repaints were most of the UI thread's work while a reply streamed
(bench/app_stream.py --profile: ``Screen._refresh_layout``), time the decode thread then waits
for. A FitStatic repaints in place and keeps the height of its tallest content (a ``min-height``)
until ``reset_fit``: a section that grows takes one layout pass, and one that would shrink and
grow back from step to step (the draft tree, the policy's optional lines) takes none and does
not make the panel below it jump. The dashboard resets its sections when a reply starts.
"""

from __future__ import annotations

from textual.widgets import Static


class FitStatic(Static):
    _fit_height: int | None = None  # the tallest content height since the last reset_fit

    def reset_fit(self) -> None:
        """Forget the tallest height: the next update lays the widget out at its content's."""
        self._fit_height = None
        self.styles.min_height = None

    def update(self, content="", *, layout: bool | None = None) -> None:  # type: ignore[override]
        """As Static.update; ``layout`` None (the default): a layout pass only where the new
        content is taller than any since ``reset_fit`` at the current width."""
        if layout is not None:
            super().update(content, layout=layout)
            return
        super().update(content, layout=False)
        width = self.content_size.width
        if not self.is_mounted or width <= 0:
            self._fit_height = None
            self.refresh(layout=True)
            return
        height = self.get_content_height(self.container_size, self.app.size, width)
        if self._fit_height is None or height > self._fit_height:
            self._fit_height = height
            self.styles.min_height = height
            self.refresh(layout=True)
