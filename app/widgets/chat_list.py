"""The chat list: a sidebar of saved chats (Ctrl+L / F4), newest first.

Enter opens the highlighted chat (or starts a new one from the first row), ``r`` renames it,
Delete pressed twice deletes it, ``/`` searches (titles and messages, as you type; Enter goes to
the list, Esc clears the search), Esc closes the list. The list only posts messages; the chat
screen owns the store and acts on them.
"""

from __future__ import annotations

from datetime import datetime, timezone

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, OptionList
from textual.widgets.option_list import Option

from ..keys import app_keys
from ..store import ChatRecord

NEW_CHAT_ID = "new"


def when(stamp: str, today: datetime | None = None) -> str:
    """A stored UTC timestamp as local time: ``14:05`` today, ``Jul 14`` this year, else ``2025-07-14``."""
    try:
        moment = datetime.fromisoformat(stamp).astimezone()
    except ValueError:
        return "?"
    today = today or datetime.now(timezone.utc).astimezone()
    if moment.date() == today.date():
        return moment.strftime("%H:%M")
    if moment.year == today.year:
        return moment.strftime("%b %d")
    return moment.strftime("%Y-%m-%d")


def chat_prompt(chat: ChatRecord, current: bool) -> Text:
    """Two lines: the title (marked if it is the open chat), then the message count and the date."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(("● " if current else "  ") + (chat.title or "(untitled)"), style="bold" if current else "")
    count = f"{chat.messages} message" + ("" if chat.messages == 1 else "s")
    text.append(f"\n  {count} · {when(chat.updated)}", style="dim")
    return text


def option_chat_id(option_id: str | None) -> int | None:
    """The chat id of an option (None: the "new chat" row)."""
    return None if option_id in (None, NEW_CHAT_ID) else int(option_id.removeprefix("chat-"))


class ChatList(Vertical):
    """The sidebar. :meth:`show_chats` fills it; it posts Opened / Renamed / Deleted / Closed."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="close_chats"),
        Binding("r", "rename", "Rename", id="rename_chat"),
        Binding("delete", "delete", "Delete", id="delete_chat"),
        Binding("slash", "search", "Search", id="search_chats", show=False),  # in the subtitle: the footer is full at 80 columns
    ]

    class Opened(Message):
        """Enter on a chat (``chat_id``) or on the "new chat" row (``chat_id`` None)."""

        def __init__(self, chat_id: int | None) -> None:
            super().__init__()
            self.chat_id = chat_id

    class Renamed(Message):
        def __init__(self, chat_id: int, title: str) -> None:
            super().__init__()
            self.chat_id = chat_id
            self.title = title

    class Deleted(Message):
        """Delete was pressed twice on the same chat."""

        def __init__(self, chat_id: int) -> None:
            super().__init__()
            self.chat_id = chat_id

    class Closed(Message):
        """Esc: the screen hides the list and gives the focus back to the prompt."""

    class Searched(Message):
        """The search text changed (empty: every chat): the screen lists the chats that match."""

        def __init__(self, query: str) -> None:
            super().__init__()
            self.query = query

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.chats: list[ChatRecord] = []
        self._armed: int | None = None  # the chat the first Delete press was on
        self._renaming: int | None = None

    def compose(self) -> ComposeResult:
        yield Input(id="chat-search", placeholder="Search (Enter: list, Esc: clear)")
        yield OptionList(id="chat-options")
        yield Input(id="chat-rename", placeholder="New title (Enter saves, Esc cancels)")

    def on_mount(self) -> None:
        self._fit_borders()
        self.query_one("#chat-rename", Input).display = False
        self.query_one("#chat-search", Input).display = False

    def on_resize(self) -> None:
        self._fit_borders()

    def _fit_borders(self) -> None:
        """The keys' hints split between the top border (search) and the bottom one (rename, delete)
        so that they fit the list's 30 columns; a border too narrow for its hint (a long remapped
        key) keeps the fitting part: the help screen (F1) lists every key."""
        room = max(0, (self.size.width or 30) - 4)
        title = app_keys(self, "Chats · {search_chats} search")
        self.border_title = title if len(title) <= room else "Chats"
        sub = app_keys(self, "{rename_chat} rename · {delete_chat} delete")
        if len(sub) > room:
            sub = app_keys(self, "{rename_chat} rename")
        self.border_subtitle = sub if len(sub) <= room else ""

    @property
    def search(self) -> str:
        """The search in force ("" when the search box is closed)."""
        box = self.query_one("#chat-search", Input)
        return box.value.strip() if box.display else ""

    def reset_search(self) -> None:
        box = self.query_one("#chat-search", Input)
        box.value, box.display = "", False

    @property
    def options(self) -> OptionList:
        return self.query_one("#chat-options", OptionList)

    def show_chats(self, chats: list[ChatRecord], current: int | None, highlight: int | None = None) -> None:
        """List ``chats`` (newest first) after a "new chat" row; highlight ``highlight`` (a chat just
        renamed, wherever the new order puts it), else ``current``. A search that matches nothing
        says so in a row that cannot be chosen."""
        self.chats = list(chats)
        self._armed = None
        options = [Option(Text(app_keys(self, "+ New chat  ({new_chat})"), style="italic"), id=NEW_CHAT_ID)]
        options += [Option(chat_prompt(chat, chat.id == current), id=f"chat-{chat.id}") for chat in chats]
        if not chats and self.search:
            options.append(Option(Text(f"no chats match “{self.search}”", style="dim italic"), id="no-match", disabled=True))
        self.options.set_options(options)
        want = current if highlight is None else highlight
        index = next((i + 1 for i, chat in enumerate(chats) if chat.id == want), 0)
        self.options.highlighted = index
        self._end_rename()

    def highlighted_chat(self) -> ChatRecord | None:
        index = self.options.highlighted
        if index is None or index == 0 or index > len(self.chats):
            return None
        return self.chats[index - 1]

    def focus_list(self) -> None:
        self.options.focus()

    # ---- events ----------------------------------------------------------------------------------
    @on(OptionList.OptionSelected, "#chat-options")
    def _selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.post_message(self.Opened(option_chat_id(event.option_id)))

    @on(OptionList.OptionHighlighted, "#chat-options")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        self._armed = None

    @on(Input.Changed, "#chat-search")
    def _search_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Searched(event.value.strip()))

    @on(Input.Submitted, "#chat-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.options.focus()

    @on(Input.Submitted, "#chat-rename")
    def _rename_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        chat_id, title = self._renaming, " ".join(event.value.split())
        self._end_rename()
        if chat_id is not None and title:
            self.post_message(self.Renamed(chat_id, title))

    # ---- actions ---------------------------------------------------------------------------------
    def action_close(self) -> None:
        if self._renaming is not None:
            self._end_rename()
        elif self.query_one("#chat-search", Input).display:  # Esc first clears a search
            self.reset_search()
            self.post_message(self.Searched(""))
            self.options.focus()
        else:
            self.post_message(self.Closed())

    def action_search(self) -> None:
        box = self.query_one("#chat-search", Input)
        box.display = True
        box.focus()

    def action_rename(self) -> None:
        chat = self.highlighted_chat()
        if chat is None:
            self.notify("Highlight a chat to rename it.", timeout=3)
            return
        self._renaming = chat.id
        box = self.query_one("#chat-rename", Input)
        box.value = chat.title
        box.display = True
        box.focus()

    def action_delete(self) -> None:
        chat = self.highlighted_chat()
        if chat is None:
            self.notify("Highlight a chat to delete it.", timeout=3)
            return
        if self._armed != chat.id:
            self._armed = chat.id
            self.notify(app_keys(self, "Press {delete_chat} again to delete “{title}”.", title=chat.title or "(untitled)"),
                        severity="warning", timeout=4, markup=False)
            return
        self._armed = None
        self.post_message(self.Deleted(chat.id))

    def _end_rename(self) -> None:
        was = self._renaming is not None
        self._renaming = None
        box = self.query_one("#chat-rename", Input)
        box.display = False
        if was:
            self.options.focus()
