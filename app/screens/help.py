"""F1: a small modal listing every key."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from ..keys import KEYS, key_display


def keys_text() -> Text:
    """Two columns: the keys (bold) and what they do."""
    rows = [(" / ".join(key_display(k) for k in keys), what) for keys, what in KEYS]
    width = max(len(keys) for keys, _ in rows)
    text = Text()
    for i, (keys, what) in enumerate(rows):
        text.append(keys.ljust(width + 2), style="bold")
        text.append(what + ("\n" if i < len(rows) - 1 else ""))
    return text


class HelpScreen(ModalScreen[None]):
    """Lists :data:`app.keys.KEYS`; Esc, F1 or q closes it."""

    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close", id="close_help")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-dialog") as dialog:
            dialog.border_title = "Keys"
            dialog.border_subtitle = "Esc closes"
            yield Static(keys_text(), id="help-keys")
