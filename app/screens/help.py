"""F1: a small modal listing every key, and where the chats are saved."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ..keys import BINDINGS as KEY_BINDINGS, KEYS, key_display, keys_of, with_keys


def keys_table(keymap: Mapping[str, str] | None = None) -> Table:
    """Two columns: the keys (bold; after the user's ``keymap``) and what they do (wrapped to the
    dialog's width)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for bid, keys, what in KEYS:
        table.add_row(" / ".join(key_display(k) for k in keys_of(keymap or {}, bid, keys)), with_keys(what, keymap))
    return table


def keys_title(path: Path | None, keymap: Mapping[str, str]) -> str:
    """The dialog's title: where the keys are rebound (app/keys.py; by default keymap.toml beside
    the chats, whose place the dialog's last line gives), and how many are."""
    name = path.name if path is not None else "keymap.toml"
    return f"Keys · {len(keymap)} rebound in {name}" if keymap else f"Keys · rebind in {name}"


def _short(path: Path) -> str:
    home = Path.home()
    return "~/" + str(path.relative_to(home)) if path.is_relative_to(home) else str(path)


def store_text(path: Path | None) -> Text:
    """Where the chats and settings are kept (``path`` None: nowhere, this run is in memory)."""
    where = "not saved (in memory)" if path is None else _short(path)
    return Text.assemble(("Chats ", "bold"), where, style="dim")


class HelpScreen(ModalScreen[None]):
    """Lists :data:`app.keys.KEYS`; Esc, F1 or q closes it. Scrolls if the terminal is short."""

    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close", id="close_help")]

    def on_key(self, event: events.Key) -> None:
        """The key that opened the help closes it, as F1 does by default: a keymap giving the help
        another key (F1 is the terminal's own in some) left that key opening it and doing nothing
        more, while F1, which no longer opens it, still closed it."""
        keymap = getattr(self.app, "keymap", None) or {}
        closing = keymap.get("close_help", KEY_BINDINGS["close_help"][0]).split(",")  # (those close it already)
        if "help" in keymap and event.key in keymap["help"].split(",") and event.key not in closing:
            event.stop()
            self.dismiss()

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-dialog") as dialog:
            keymap = getattr(self.app, "keymap", None) or {}
            dialog.border_title = keys_title(getattr(self.app, "keymap_path", None), keymap)
            dialog.border_subtitle = with_keys("{close_help} closes", keymap)
            yield Static(keys_table(keymap), id="help-keys")
            store = getattr(self.app, "store", None)
            if store is not None:
                yield Static(store_text(store.path), id="help-store")
