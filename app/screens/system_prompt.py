"""Ctrl+P "System prompt…": what the model is told before the chat, for this chat and new ones."""

from __future__ import annotations

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Checkbox, Static

from ..keys import app_keys
from ..widgets.prompt import PromptInput

TEXT_ROWS = 8  # the text box's rows in a terminal tall enough
FULL_HEIGHT = 20  # terminal rows from which the dialog shows its help line (border 2, help ~3 + 1, box 8, checkbox 3)
SYSTEM_HELP = ("What the model reads before the conversation: a persona, a style, rules. Empty: the "
               "model's own default. A change applies from the next reply (the chat is read again).")


class SystemPromptInput(PromptInput):
    """The dialog's text box: Enter saves, Shift+Enter or Ctrl+J inserts a new line (as the prompt)."""

    def __init__(self, text: str, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.placeholder = "(none: the model's default)"
        self.text = text


class SystemPromptScreen(ModalScreen[tuple[str, bool] | None]):
    """Edits a system prompt. Dismissed with (text, also for new chats), or None on Esc."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="cancel_system")]

    def __init__(self, text: str, for_new_chats: bool) -> None:
        super().__init__()
        self._text, self._for_new_chats = text, for_new_chats

    def compose(self) -> ComposeResult:
        with Vertical(id="system-dialog") as dialog:
            dialog.border_title = "System prompt"
            dialog.border_subtitle = app_keys(self, "Enter saves · Ctrl+J new line · Tab · {cancel_system} cancels")
            yield Static(SYSTEM_HELP, id="system-help")
            yield SystemPromptInput(self._text, id="system-text")
            yield Checkbox("Also for new chats", value=self._for_new_chats, id="system-default")

    def on_mount(self) -> None:
        box = self.query_one(SystemPromptInput)
        box.move_cursor(box.document.end)
        box.focus()
        self._fit(self.size.height)

    def on_resize(self, event: events.Resize) -> None:
        self._fit(event.size.height)

    def _fit(self, height: int) -> None:
        """Keep the checkbox on screen in a short terminal: below FULL_HEIGHT rows the help line
        goes and the text box takes what is left (at least 3 rows, at most its usual 8)."""
        short = height < FULL_HEIGHT
        self.query_one("#system-help").display = not short
        box = self.query_one(SystemPromptInput)
        box.styles.height = max(3, min(TEXT_ROWS, height - 2 - 3)) if short else TEXT_ROWS

    @on(PromptInput.Submitted)
    def _save(self, event: PromptInput.Submitted) -> None:
        event.stop()
        self.dismiss((event.text.strip(), self.query_one(Checkbox).value))

    def action_cancel(self) -> None:
        self.dismiss(None)
