"""The message box: Enter sends, Shift+Enter or Ctrl+J inserts a new line, Up/Down recall prompts,
PageUp/PageDown scroll the conversation."""

from __future__ import annotations

from collections.abc import Iterable

from rich.segment import Segment
from textual import events
from textual.message import Message
from textual.strip import Strip
from textual.widgets import TextArea

from ..keys import app_keys, with_keys
from ..text_safety import strip_controls

NEWLINE_KEYS = ("shift+enter", "ctrl+j")
PLACEHOLDER = "Message  (Enter send · Ctrl+J new line · ↑ earlier · {help} help)"  # fits 70 columns (the chat beside the dashboard at 120)


class PromptInput(TextArea):
    """A multi-line input. Many terminals send the same byte for Enter and Shift+Enter, hence the
    Ctrl+J fallback (Shift+Enter works in terminals with the Kitty keyboard protocol).

    Like a shell, Up and Down walk through :attr:`prompts` (earlier prompts, oldest first) while
    the box is empty or holds one line, or still holds the multi-line prompt Up just recalled, and
    the cursor is on the box's first (Up) or last (Down) row: in a long line wrapped over several
    rows they move the cursor between the rows. Down past the newest prompt brings back what was
    being typed. PageUp and PageDown scroll the conversation (:class:`ScrollConversation`) while the
    box's own text fits it (the box has the focus all the time, so the messages would otherwise
    need a mouse to read back).
    """

    class Submitted(Message):
        """The user pressed Enter; ``text`` is what the box held (not yet cleared)."""

        def __init__(self, prompt: PromptInput, text: str) -> None:
            super().__init__()
            self.prompt = prompt
            self.text = text

        @property
        def control(self) -> PromptInput:
            return self.prompt

    class ScrollConversation(Message):
        """PageUp (``pages`` -1) or PageDown (+1) pressed in a box with nothing to page through."""

        def __init__(self, pages: int) -> None:
            super().__init__()
            self.pages = pages

    def __init__(self, **kwargs: object) -> None:
        super().__init__(
            soft_wrap=True,
            tab_behavior="focus",
            show_line_numbers=False,
            highlight_cursor_line=False,
            placeholder=with_keys(PLACEHOLDER),
            **kwargs,  # type: ignore[arg-type]
        )
        self.prompts: list[str] = []
        self._recalled: int | None = None  # index into history of the prompt on show, if any
        self._draft = ""  # what was typed before Up was first pressed

    def on_mount(self) -> None:
        if self.placeholder == with_keys(PLACEHOLDER):  # the chat's prompt: the help key as the user's keymap has it
            self.placeholder = app_keys(self, PLACEHOLDER)

    def render_line(self, y: int) -> Strip:
        """As TextArea's; an empty box squeezed to no text column at all draws nothing: Textual 8.2.8
        wraps its placeholder at width 0 and raises (ValueError, in rich's chop_cells), which ended
        the app (the chat list open in a 31-34 column terminal)."""
        if not self.text and self.content_size.width <= 0:
            return Strip.blank(0)
        strip = super().render_line(y)
        # a control character in the text (a recalled prompt, an edited message) drawn as it was
        # reached the terminal ("\x1b[2J" cleared it): dropped from what is drawn (they take no cell)
        if any(strip_controls(segment.text, sequences=False) != segment.text for segment in strip):
            strip = Strip([Segment(strip_controls(text, sequences=False), style, control)
                           for text, style, control in strip], strip.cell_length)
        return strip

    async def _on_paste(self, event: events.Paste) -> None:
        """A paste without terminal escape sequences and control characters (coloured output copied
        from a log, a stray ESC): they were inserted as they were, drawn raw to the terminal (which
        acted on them) and sent to the model."""
        clean = strip_controls(event.text)
        if clean != event.text:  # (else TextArea's handler, next in the MRO, pastes it as it is)
            event.prevent_default()
            if not self.read_only and (result := self._replace_via_keyboard(clean, *self.selection)):
                self.move_cursor(result.end_location)
                self.focus()

    # ---- history ---------------------------------------------------------------------------------
    def set_history(self, prompts: Iterable[str]) -> None:
        """Replace the history (oldest first) and stop any recall in progress."""
        self.prompts = list(prompts)
        self._recalled = None

    def remember(self, prompt: str) -> None:
        """Add a sent prompt to the end of the history (a repeat of the last one is not added)."""
        if prompt and (not self.prompts or self.prompts[-1] != prompt):
            self.prompts.append(prompt)
        self._recalled = None

    def _can_recall(self, key: str) -> bool:
        if "\n" in self.text:  # only the multi-line prompt Up just recalled walks on
            return self._recalled is not None and self.text == self.prompts[self._recalled]
        # one line, maybe wrapped over several rows: only from its first (Up) or last (Down) row
        wrapped = self.wrapped_document
        row = wrapped.location_to_offset(self.cursor_location).y
        return row == 0 if key == "up" else row >= wrapped.height - 1

    def recall(self, step: int) -> bool:
        """Show the prompt ``step`` places older (-1) or newer (+1); False if there is none."""
        if not self.prompts or (self._recalled is None and step > 0):
            return False
        if self._recalled is None:
            self._draft = self.text
            index = len(self.prompts) - 1
        else:
            index = self._recalled + step
            if index < 0:
                return False  # already at the oldest
        if index >= len(self.prompts):
            self._recalled, text = None, self._draft
        else:
            self._recalled, text = index, self.prompts[index]
        self.text = text
        self.move_cursor(self.document.end)
        return True

    # ---- keys ------------------------------------------------------------------------------------
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
        if event.key in ("pageup", "pagedown") and self.max_scroll_y == 0:
            event.stop()
            event.prevent_default()
            self.post_message(self.ScrollConversation(-1 if event.key == "pageup" else 1))
            return
        if event.key in ("up", "down") and self._can_recall(event.key) and self.recall(-1 if event.key == "up" else 1):
            event.stop()
            event.prevent_default()
            return
        await super()._on_key(event)
