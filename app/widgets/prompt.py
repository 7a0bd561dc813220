"""The message box: Enter sends, Shift+Enter or Ctrl+J inserts a new line."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea

NEWLINE_KEYS = ("shift+enter", "ctrl+j")


class PromptInput(TextArea):
    """A multi-line input. Many terminals send the same byte for Enter and Shift+Enter, hence the
    Ctrl+J fallback (Shift+Enter works in terminals with the Kitty keyboard protocol)."""

    class Submitted(Message):
        """The user pressed Enter; ``text`` is what the box held (not yet cleared)."""

        def __init__(self, prompt: PromptInput, text: str) -> None:
            super().__init__()
            self.prompt = prompt
            self.text = text

        @property
        def control(self) -> PromptInput:
            return self.prompt

    def __init__(self, **kwargs: object) -> None:
        super().__init__(
            soft_wrap=True,
            tab_behavior="focus",
            show_line_numbers=False,
            highlight_cursor_line=False,
            placeholder="Message  (Enter send · Shift+Enter/Ctrl+J new line · F1 help)",
            **kwargs,  # type: ignore[arg-type]
        )

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self._replace_via_keyboard("\n", start, end)
            return
        await super()._on_key(event)
