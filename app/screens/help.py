"""F1: a small modal listing every key, and where the chats are saved."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ..keys import KEYS, key_display


def keys_table() -> Table:
    """Two columns: the keys (bold) and what they do (wrapped to the dialog's width)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for keys, what in KEYS:
        table.add_row(" / ".join(key_display(k) for k in keys), what)
    return table


def store_text(path: Path | None) -> Text:
    """Where the chats and settings are kept (``path`` None: nowhere, this run is in memory)."""
    home = Path.home()
    where = "not saved (in memory)" if path is None else (
        "~/" + str(path.relative_to(home)) if path.is_relative_to(home) else str(path))
    return Text.assemble(("Chats ", "bold"), where, style="dim")


class HelpScreen(ModalScreen[None]):
    """Lists :data:`app.keys.KEYS`; Esc, F1 or q closes it. Scrolls if the terminal is short."""

    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close", id="close_help")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-dialog") as dialog:
            dialog.border_title = "Keys"
            dialog.border_subtitle = "Esc closes"
            yield Static(keys_table(), id="help-keys")
            store = getattr(self.app, "store", None)
            if store is not None:
                yield Static(store_text(store.path), id="help-store")
