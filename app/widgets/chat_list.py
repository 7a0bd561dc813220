"""The chat list: a sidebar of saved chats (Ctrl+L / F4), newest first.

Enter opens the highlighted chat (or starts a new one from the first row), ``r`` renames it,
Delete pressed twice deletes it, ``/`` searches (titles and messages, as you type; Enter goes to
the list, Esc clears the search), Esc closes the list. The list only posts messages; the chat
screen owns the store and acts on them.

A search of a long list runs once typing pauses (SEARCH_PAUSE_S), not per keystroke: with 1,000
chats each one cost ~200 ms (the query, then every option's text measured again), so typing
lagged behind the keys. Rows are kept between listings (their measured text with them), and a
listing the same as the one shown is not rebuilt.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Input, OptionList
from textual.widgets.option_list import Option

from ..keys import app_keys
from ..store import ChatRecord

NEW_CHAT_ID = "new"
SEARCH_PAUSE_S = 0.15  # a long list is searched once typing has paused this long
SEARCH_PAUSE_FROM = 200  # chats: a shorter list is searched at every keystroke (a few ms each)
ROWS_KEPT = 5000  # rows kept for the next listings beyond those shown (each holds its measured text)


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


def chat_prompt(chat: ChatRecord, current: bool, today: datetime | None = None) -> Text:
    """Two lines: the title (marked if it is the open chat), then the message count and the date."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(("● " if current else "  ") + (chat.title or "(untitled)"), style="bold" if current else "")
    count = f"{chat.messages} message" + ("" if chat.messages == 1 else "s")
    text.append(f"\n  {count} · {when(chat.updated, today)}", style="dim")
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
        """The search to list (empty: every chat), posted as the text changes (for a long list,
        once typing pauses) and on Enter: the screen lists the chats that match."""

        def __init__(self, query: str) -> None:
            super().__init__()
            self.query = query

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.chats: list[ChatRecord] = []
        self._armed: int | None = None  # the chat the first Delete press was on
        self._renaming: int | None = None
        self._full = 0  # chats in the last listing without a search: a long list waits for typing to pause
        self._search_timer: Timer | None = None
        self._asked = ""  # the search last posted (Searched)
        self._unanswered = 0  # searches posted that no show_chats has answered yet
        self._focus_when_listed = False  # Enter in the search box: the list takes the keys once it shows the search
        self._rows: dict[tuple[object, ...], Option] = {}  # (chat, its fields shown, current, day) -> its row
        self._shown: list[Option] = []  # the rows the OptionList has

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
        """Close the search box (the list is hidden, or about to show every chat)."""
        box = self.query_one("#chat-search", Input)
        box.value, box.display = "", False
        self._stop_search_timer()
        self._asked, self._unanswered, self._focus_when_listed = "", 0, False

    @property
    def options(self) -> OptionList:
        return self.query_one("#chat-options", OptionList)

    def show_chats(self, chats: list[ChatRecord], current: int | None, highlight: int | None = None) -> None:
        """List ``chats`` (newest first) after a "new chat" row; highlight ``highlight`` (a chat just
        renamed, wherever the new order puts it), else ``current``. A search that matches nothing
        says so in a row that cannot be chosen."""
        self.chats = list(chats)
        self._armed = None
        if not self.search:
            self._full = len(self.chats)
        new_chat = app_keys(self, "+ New chat  ({new_chat})")
        options = [self._row(("new", new_chat), lambda: Option(Text(new_chat, style="italic"), id=NEW_CHAT_ID))]
        today = datetime.now(timezone.utc).astimezone()
        for chat in chats:
            mark = chat.id == current
            options.append(self._row((chat.id, chat.title, chat.messages, chat.updated, mark, today.date()),
                                     lambda chat=chat, mark=mark: Option(chat_prompt(chat, mark, today), id=f"chat-{chat.id}")))
        if not chats and self.search:
            query = self.search
            options.append(self._row(("no-match", query), lambda: Option(
                Text(f"no chats match “{query}”", style="dim italic"), id="no-match", disabled=True)))
        if len(options) != len(self._shown) or any(a is not b for a, b in zip(options, self._shown)):
            self.options.set_options(options)  # (the same rows again: only the highlight below)
            self._shown = options
        if len(self._rows) > ROWS_KEPT + len(options):  # keep what is shown, drop the rest
            kept = {id(o) for o in options}
            self._rows = {k: o for k, o in self._rows.items() if id(o) in kept}
        want = current if highlight is None else highlight
        index = next((i + 1 for i, chat in enumerate(chats) if chat.id == want), 0)
        self.options.highlighted = index
        self._end_rename()
        self._unanswered = max(0, self._unanswered - 1)
        if self._focus_when_listed and not self._unanswered:
            self._focus_when_listed = False
            self.options.focus()

    def _row(self, key: tuple[object, ...], make: Callable[[], Option]) -> Option:
        """The row for ``key`` (what it shows) from an earlier listing, else ``make()``: a kept row
        keeps its measured text, which the OptionList would otherwise measure again (~0.1 ms a row)."""
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = make()
        return row

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
        self._stop_search_timer()
        if self._full >= SEARCH_PAUSE_FROM:
            self._search_timer = self.set_timer(SEARCH_PAUSE_S, self._search_now, name="chat-search")
        else:
            self._search_now()

    @on(Input.Submitted, "#chat-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        """Enter: search now (no pause to wait out); the list takes the keys once it shows that
        search, so that an Enter right after opens a chat of the search typed, not of an older one."""
        event.stop()
        self._search_now()
        if self._unanswered:
            self._focus_when_listed = True
        else:
            self.options.focus()

    @on(Input.Blurred, "#chat-search")
    def _search_blurred(self, event: Input.Blurred) -> None:
        self._search_now()  # the focus went to the list (a click, Tab): it lists what was typed

    def _search_now(self) -> None:
        """Post the search box's text unless it is the search last posted."""
        self._stop_search_timer()
        if self.search != self._asked:
            self._ask(self.search)

    def _ask(self, query: str) -> None:
        self._stop_search_timer()
        self._asked = query
        self._unanswered += 1
        self.post_message(self.Searched(query))

    def _stop_search_timer(self) -> None:
        if self._search_timer is not None:
            self._search_timer.stop()
            self._search_timer = None

    @on(Input.Submitted, "#chat-rename")
    def _rename_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        chat_id, title = self._renaming, " ".join(event.value.split())
        self._end_rename()
        if chat_id is not None and title:
            self.post_message(self.Renamed(chat_id, title))
        elif chat_id is not None:  # (it closed the box and said nothing: the rename looked lost)
            was = next((chat.title for chat in self.chats if chat.id == chat_id), "")
            self.notify(f"A chat's title cannot be empty: it stays “{was or '(untitled)'}”.", timeout=4, markup=False)

    # ---- actions ---------------------------------------------------------------------------------
    def action_close(self) -> None:
        if self._renaming is not None:
            self._end_rename()
        elif self.query_one("#chat-search", Input).display:  # Esc first clears a search
            self.reset_search()
            self._ask("")
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
