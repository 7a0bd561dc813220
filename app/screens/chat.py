"""The chat screen: messages, the prompt, the chat list, the live dashboard, the status line, the reply in flight."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.actions import SkipAction
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Static
from textual.worker import get_current_worker

from engine.session import ChatEngine, leading_system, strategy_label
from engine.strategy import StrategyError

from ..gc_hold import FULL_COLLECTIONS
from ..keys import app_keys
from ..reply import ReplyRun, add_change
from ..store import ChatChanged, ChatRecord, ChatStore, StoreError, strategy_from_dict, title_from
from ..strategy_cycle import in_app
from ..widgets import ChatMessage, Dashboard, MessageList, PromptInput, StatusLine
from ..widgets.chat_list import ChatList
from ..widgets.status import FINISH_TEXT
from .system_prompt import SystemPromptScreen

# While a reply streams, the UI does all its work in one frame every FRAME_INTERVAL_S: take the
# engine's events, write the new text to the reply's Markdown, refresh the status line and repaint
# the dashboard, so Textual lays out and renders the screen once a frame (it had three timers of
# their own: drains at 10/s, Markdown at 4/s, dashboard at 4/s). The UI thread shares the cores with
# the decode threads; a frame costs ~40-70 ms of UI CPU on the 2-core EPYC, and 1/8 s frames took
# ~1.3x the UI CPU of 1/4 s ones, 1/2 s ~0.7x (`bench/app_ui_cost.py`,
# bench/results/2026-11-26-app-frames/). Slower frames would show the text in 30+ token chunks.
FRAME_INTERVAL_S = 1 / 4
MARKDOWN_INTERVAL_S = FRAME_INTERVAL_S  # the reply's text is written once a frame at most
AR_BASELINE_MIN_TOKENS = 32  # a plain-decoding reply this long becomes the speedup's reference (_ar_baseline)
BESIDE_DASHBOARD_MIN_WIDTH = 30  # fewer columns for the messages than this: the dashboard is not shown (a notice says why)
CHAT_MIN_WIDTH = 40  # the message column's fewest columns with the chat list open (else the dashboard makes way)
DASHBOARD_MIN_WIDTH = 100  # narrower terminals start with the dashboard hidden (the key still shows it)
NEW_CHAT_TITLE = "New chat"
RETRY_UNSAVED_S = 10.0  # messages a failed write left unsaved are tried again this often (_retry_unsaved)
CONTEXT_NOTICE = ("Context full: the reply reached the end of the model's context window. "
                  "Send another message to go on (the oldest turns are left out), or {new_chat} for a new chat.")
WINDOW_NOTICE = ("The whole chat no longer fits the model's {context:,}-token context: its {n} oldest "
                 "message{s} left out of what the model reads (the chat keeps {them}).")
LENGTH_NOTICE = "The reply stopped at the {n}-token limit: Ctrl+P \"Continue the last reply\" goes on from there."
TOO_LONG_NOTICE = "This message does not fit the model's context window, even with the chat's earlier messages left out: shorten it."
READING_STATE = "reading the prompt…"
EDITING_STATE = "editing your last message: Enter replaces it and its reply, {stop} cancels"
REGENERATE_EMPTY_NOTICE = "The new reply brought nothing back: the previous reply is kept."
REGENERATE_TOO_LONG_NOTICE = ("Your last message no longer fits the model's context window, even with the chat's earlier "
                              "messages left out: the previous reply is kept. Ctrl+P \"Edit the last message\" shortens it.")
STOPPED_EMPTY_NOTICE = "Stopped before the first token: your message is back in the prompt."
STOPPED_DRAFT_NOTICE = "Stopped before the first token: your message is back in the prompt, above what you were typing."
BUSY_NOTICE = "A reply is still running: wait for it, or press {stop} to stop it."
STOPPING_NOTICE = "The reply is stopping: try again in a moment."
QUEUED_NOTICE = "The reply is stopping: your message goes as soon as it has stopped."
EDIT_OPEN_NOTICE = "Send or cancel ({stop}) the edit of your last message first."
EDIT_KEPT_NOTICE = ("The edited message brought nothing back: the message it was to replace and its reply are kept, "
                    "and your edit is back in the prompt (Enter replaces them, {stop} cancels).")
# the notices above name keys by binding id ({new_chat}): ChatScreen._keys fills in the keymap's keys


def failure_notice(run: ReplyRun) -> str:
    return f"Generation failed: {run.error or 'the engine reported an error'}"


def window_notice(context: int, n: int) -> str:
    """What the app says when the engine leaves the chat's ``n`` oldest messages out."""
    return WINDOW_NOTICE.format(context=context, n=n, s=" is" if n == 1 else "s are", them="it" if n == 1 else "them")


# settings keys (values are JSON)
SETTING_STRATEGY = "strategy"  # Strategy.to_dict() of the last strategy picked with Ctrl+S / F2
SETTING_DASHBOARD = "dashboard_visible"  # the last Ctrl+D / F3 choice
SETTING_THEME = "theme"  # App.theme, saved whenever it changes (command palette: "Change theme")
SETTING_SYSTEM = "system_prompt"  # the system prompt of new chats ("" or missing: the model's default)


def reply_stats(run: ReplyRun, finish_reason: str | None) -> dict[str, Any]:
    """What is saved with a reply: tokens, steps, tok/s, mean accepted tokens per step, how it ended,
    the strategy of its last step and, where it was switched mid-reply, every strategy in order."""
    s = run.summary
    stats: dict[str, Any] = {
        "tokens": s.new_tokens, "steps": s.steps, "tok_s": round(s.tokens_per_s, 2),
        "mean_accepted": round(s.mean_accepted, 3), "finish_reason": finish_reason,
    }
    if run.last_event is not None:
        stats["strategy"] = run.last_event.strategy
    if len(run.strategies) > 1:
        stats["strategies"] = list(run.strategies)
    return stats


def continued_stats(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, Any]:
    """A continued reply's stats: its parts' tokens and steps added, tok/s over their decode time
    together, mean accepted over all their steps; how it ended and the strategy are the last
    part's (``strategies`` lists each change across the parts), ``continued`` counts the
    continuations. A first part without stats (an old database) leaves the continuation's own."""
    b = before or {}
    try:
        tokens, steps = int(b["tokens"]) + int(after["tokens"]), int(b["steps"]) + int(after["steps"])
        continued = int(b.get("continued") or 0) + 1
        timed = all(float(x["tok_s"]) > 0 for x in (b, after) if int(x["tokens"]) > 0)
        secs = sum(int(x["tokens"]) / float(x["tok_s"]) for x in (b, after) if int(x["tokens"]) > 0) if timed else 0.0
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return {**after, "continued": 1}
    out = {**after, "tokens": tokens, "steps": steps, "tok_s": round(tokens / secs, 2) if secs > 0 else after.get("tok_s", 0.0),
           "mean_accepted": round(tokens / steps, 3) if steps else 0.0, "continued": continued}
    used: list[str] = []  # the strategies of both parts, each change in order
    for x in (b, after):
        labels = x.get("strategies")
        for label in labels if isinstance(labels, list) else [x.get("strategy")]:  # (a damaged list: the last one)
            add_change(used, label if isinstance(label, str) else None)
    if len(used) > 1:
        out["strategies"] = used
    return out


class ChatScreen(Screen[None]):
    """The open chat with the session the app hands over through :meth:`attach_session`.

    The conversation (a list of {"role", "content"}) is sent whole every turn. The engine runs in
    a thread worker; this screen only drains its queue on a timer (see :mod:`app.reply`).
    Every message is written to ``store`` as soon as it is complete: the user's when sent, a reply
    when it ends (or is stopped). The screen lives as long as the app and closes the store when
    it is unmounted. ``store_error``: why the store is in memory only, or where the damaged database
    it replaces was kept (shown once mounted).
    ``restore_strategy``: apply the saved strategy to a session once it is attached (False when
    the command line chose one, until a strategy is picked live). ``sampling``: Strategy fields the
    command line set (``specchat chat --temperature 0.7 ...``), applied over the first attached
    session's strategy, whichever it is.
    """

    BINDINGS = [
        Binding("escape", "stop", "Stop", id="stop"),
        Binding("ctrl+d,f3", "toggle_dashboard", "Dashboard", id="toggle_dashboard", priority=True),
        # the chat title line shows these two (the footer has no room left at 80 columns)
        Binding("ctrl+l,f4", "toggle_chats", "Chats", id="toggle_chats", show=False),
        Binding("ctrl+n", "new_chat", "New chat", id="new_chat", show=False),
        Binding("ctrl+r", "regenerate", "Regenerate", id="regenerate", show=False),
        # priority: the prompt's TextArea binds ctrl+y to redo (super+y still redoes)
        Binding("ctrl+y", "copy_reply", "Copy reply", id="copy_reply", show=False, priority=True),
    ]

    def __init__(
        self,
        max_new_tokens: int = 512,
        store: ChatStore | None = None,
        store_error: str | None = None,
        restore_strategy: bool = True,
        system_prompt: str | None = None,
        sampling: dict[str, object] | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._system_override = system_prompt  # `specchat chat --system`: new chats' prompt this run
        self.default_system = ""  # the system prompt a new chat starts with (settings, or the override)
        self.max_new_tokens = max_new_tokens
        self.store = store if store is not None else ChatStore.open(None)
        self.store_error = store_error
        self.restore_strategy = restore_strategy
        self._sampling = dict(sampling or {})  # applied once, at the first attach (attach_session)
        self.session: ChatEngine | None = None
        self.session_error: str | None = None
        self.conversation: list[dict[str, str]] = []
        self.chat_id: int | None = None  # None: a new chat, saved when its first message is sent
        self.chat_title = ""
        self._kept_title = ""  # a renamed chat emptied by an edit of its only message: its title, for the chat saved again
        self.status_line = StatusLine(id="status")
        self.title_bar = Static(id="chat-title")
        self.chat_list = ChatList(id="chat-list")
        self._run: ReplyRun | None = None
        self._reply: ChatMessage | None = None
        self._timer: Timer | None = None
        self._gc_held = False  # this screen holds FULL_COLLECTIONS (from a reply's start to its finish)
        self._finishing = False
        self._reply_saved = False
        self._saved_n = 0  # the messages of chat_id this window saved or loaded: its next message's index there
        self._unsaved_stats: dict[int, tuple[str, dict[str, Any] | None]] = {}  # a failed save's (content, stats), by index
        self._quiet_saves = False  # a retry of unsaved messages: no toast for each write that still fails
        self._send_when_stopped = False  # Enter pressed while the reply was stopping: send once it has (_send_queued)
        self._editing: int | None = None  # "Edit the last message": the conversation index the next send replaces
        self._draft_before_edit = ""  # the prompt's text when that edit began
        self._replaced: tuple[str, dict[str, Any] | None] | None = None  # Ctrl+R: the reply being replaced, until the new one has text
        # an edit sent: where the messages it replaced began and those messages (role, content, stats), until the new reply has text
        self._edited: tuple[int, list[tuple[str, str, dict[str, Any] | None]]] | None = None
        self._window_shown: tuple[int | None, int] | None = None  # (chat, messages left out) last told
        self._continuing: tuple[str, dict[str, Any] | None] | None = None  # "Continue": the reply's text and stats before
        self.dashboard = Dashboard(id="dashboard")
        self._dashboard_choice: bool | None = None  # the user's toggle; None: by terminal width
        self._wide: bool | None = None
        self._dashboard_for_list = False  # the dashboard was hidden while the chat list is open

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield self.chat_list
            with Vertical(id="chat-column"):
                yield self.title_bar
                yield MessageList(id="messages")
                yield PromptInput(id="prompt")
            yield self.dashboard
        yield self.status_line
        yield Footer()

    async def on_mount(self) -> None:
        self.chat_list.display = False
        self.prompt.focus()
        self._apply_width(self.app.size.width)
        if self.store_error is not None:  # (with a file open: a damaged one was kept aside, app.store.open_store)
            title = "Chats are not being saved" if self.store.path is None else "The chat database was damaged"
            self.notify(self.store_error, title=title, severity="error", timeout=20, markup=False)
        self._restore_settings()
        self.set_interval(RETRY_UNSAVED_S, self._retry_unsaved)
        self.prompt.set_history(self._load(self.store.prompt_history, []))
        chats = self._load(self.store.chats, [])
        # `--system`: a new chat with it (an old chat keeps the system prompt it was held with)
        # (announce: where the model came first, else attach_session says it)
        await self._show_chat(chats[0].id if chats and self._system_override is None else None, announce=True)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    # ---- the store ---------------------------------------------------------------------------------
    def _load(self, read: Any, default: Any, *args: Any) -> Any:
        """``read(*args)``; on a StoreError, an error toast and ``default``."""
        try:
            return read(*args)
        except StoreError as exc:
            self.notify(str(exc), title="Could not read the chats", severity="error", timeout=10, markup=False)
            return default

    def _save(self, write: Any, *args: Any, **kwargs: Any) -> Any:
        """``write(*args, **kwargs)``; on a StoreError, an error toast (the chat goes on unsaved).
        ChatChanged (another window wrote to the chat) is the caller's to handle."""
        try:
            return write(*args, **kwargs)
        except ChatChanged:
            raise
        except StoreError as exc:
            if not self._quiet_saves:
                self.notify(str(exc), title="Chat not saved", severity="error", timeout=10, markup=False)
            return None

    def _message_list(self) -> MessageList | None:
        """The shown messages; None once they are gone (a save at quit runs after they are removed)."""
        try:
            return self.query_one(MessageList)
        except NoMatches:
            return None

    def _retry_unsaved(self) -> int:
        """Save the messages a failed write left unsaved (a full disk, a file locked by another
        program), in order, without waiting for the next message, which was the only retry: the
        user who read "Chat not saved", freed the disk and quit, or opened another chat, lost them.
        Run every RETRY_UNSAVED_S while any wait, before another chat is opened, and at quit; quiet
        while the writes still fail (the first failure said so), a notice when they are saved.
        Returns how many messages still wait."""
        def waiting() -> int:
            return sum(m["role"] != "system" for m in self.conversation[self._saved_n:])

        n = waiting()
        if n == 0 or self._run is not None:  # (a reply in flight saves them before itself)
            return n
        last = self.conversation[-1]
        kept = self._unsaved_stats.get(len(self.conversation) - 1)
        stats = kept[1] if kept is not None and kept[0] == last["content"] else None
        self._quiet_saves = True
        try:
            self._save_message(last["role"], last["content"], stats)
        finally:
            self._quiet_saves = False
        left = waiting()
        if left == 0 and self.is_mounted:
            self.notify(f"Saved {n} message{'s' if n != 1 else ''} of this chat that could not be saved before.", timeout=6)
        return left

    def _save_message(self, role: str, content: str, stats: dict[str, Any] | None = None) -> None:
        """Commit one complete message (creating the chat with its first one). The messages before
        it that a failed write left unsaved (a full disk: "Chat not saved") are saved first, in
        order: the next message was saved at the next free index, and the chat on disk skipped the
        one it answered (two replies in a row, the user's message gone for good)."""
        session = self.session
        model = session.description if session is not None else None
        strategy = session.strategy.to_dict() if session is not None else None
        if role == "user" and not self.chat_title:
            self.chat_title = title_from(content)
            self._show_title()
        if self.chat_id is None:
            self.chat_id = self._save(self.store.new_chat, title=self._kept_title, model=model or "", strategy=strategy)
            self._kept_title = ""
            self._saved_n = 0
            if self.chat_id is None:
                return
        # its index in the conversation: the last message, or one past it (a reply saved at quit is not in it)
        at = len(self.conversation) - (1 if self.conversation and self.conversation[-1] == {"role": role, "content": content} else 0)
        try:
            behind = self.conversation[self._saved_n:at]  # (a new chat's system prompt too)
            shown = self._message_list() if behind else None
            for i, m in enumerate(behind, start=self._saved_n):
                kept = self._unsaved_stats.get(i)
                if kept is not None and kept[0] == m["content"]:
                    earlier = kept[1]
                else:  # (its stats are gone: how it ended, from its mark on screen)
                    reason = shown.finish_reason_at(i) if shown is not None and m["role"] == "assistant" else None
                    earlier = {"finish_reason": reason} if reason else None
                if self._save(self.store.add_message, self.chat_id, m["role"], m["content"], earlier, at=self._saved_n) is None:
                    self._unsaved_stats[at] = (content, stats)
                    return  # (still failing: said so; this message waits with them)
                self._saved_n += 1
            if behind and any(m["role"] != "system" for m in behind) and not self._quiet_saves:  # (a retry says it itself)
                n = sum(m["role"] != "system" for m in behind)
                self.notify(f"Saved {n} earlier message{'s' if n != 1 else ''} of this chat that could not be saved before.",
                            timeout=6)
            if self._save(self.store.add_message, self.chat_id, role, content, stats, model=model, strategy=strategy,
                          at=self._saved_n) is not None:
                self._saved_n += 1
                self._unsaved_stats.clear()
            else:
                self._unsaved_stats[at] = (content, stats)
        except ChatChanged:  # another window wrote to this chat: this window's conversation goes on in a copy
            last = self.conversation[-1] if self.conversation else None
            mine = list(self.conversation)
            if last != {"role": role, "content": content}:  # (a reply saved at quit is not in the conversation)
                mine.append({"role": role, "content": content})
            self._fork(mine, stats)

    def _fork(self, messages: list[dict[str, str]], last_stats: dict[str, Any] | None = None) -> None:
        """This window's ``messages`` saved as a new chat, which it shows from now on: the chat it had
        open was written to by another specchat window (its saved messages are no longer this
        window's, and writing by this window's indices would delete or mix the other's)."""
        session = self.session
        title = f"{self.chat_title or NEW_CHAT_TITLE} (copy)"
        self.chat_id = self._save(self.store.new_chat, title=title, model=session.description if session else "",
                                  strategy=session.strategy.to_dict() if session is not None else None)
        self._saved_n = 0
        if self.chat_id is None:
            return
        for i, m in enumerate(messages):
            stats = last_stats if i == len(messages) - 1 else None
            if self._save(self.store.add_message, self.chat_id, m["role"], m["content"], stats, at=self._saved_n) is None:
                break
            self._saved_n += 1
        self.chat_title = title
        self._show_title()
        self.notify("This chat was changed in another specchat window: this window's conversation goes on as a "
                    f"new chat, {title!r}.", severity="warning", timeout=10, markup=False)

    @property
    def _n_system(self) -> int:
        """How many system messages open the conversation (0 or 1)."""
        return leading_system(self.conversation)

    @property
    def _system_text(self) -> str:
        """This chat's system prompt ("": none)."""
        return self.conversation[0]["content"] if self._n_system else ""

    def _last_reply_stats(self) -> dict[str, Any] | None:
        """The saved stats of the chat's last message, if it is a reply."""
        saved = self._load(self.store.messages, [], self.chat_id) if self.chat_id is not None else []
        return saved[-1].stats if saved and saved[-1].role == "assistant" else None

    @property
    def _has_user_message(self) -> bool:
        return any(m["role"] == "user" for m in self.conversation)

    def _drop_messages_from(self, keep: int) -> None:
        """Forget the saved messages from conversation index ``keep`` on (a chat left with no
        message but its system prompt goes too)."""
        if self.chat_id is None:
            return
        renamed = False
        if keep <= self._n_system:  # a title the user gave (not the first message's) comes back with the chat
            first = next((m.content for m in self._load(self.store.messages, [], self.chat_id) if m.role == "user"), None)
            renamed = bool(self.chat_title) and (first is None or self.chat_title != title_from(first))
        try:
            if self._save(self.store.truncate, self.chat_id, keep, expect=self._saved_n) is not None:
                self._saved_n = min(self._saved_n, keep)
        except ChatChanged:  # another window wrote to it: its messages stay, this window's go on in a copy
            self._fork(self.conversation[:keep])
            return
        if keep <= self._n_system:
            self._save(self.store.delete_chat, self.chat_id)
            self._kept_title = self.chat_title if renamed else ""
            self.chat_id, self.chat_title = None, self._kept_title
            self._show_title()

    def _restore_settings(self) -> None:
        """Theme and dashboard choice from the last run; the theme is saved whenever it changes."""
        theme = self._load(self.store.get_setting, None, SETTING_THEME)
        if isinstance(theme, str) and theme != self.app.theme:
            if theme in self.app.available_themes:
                self.app.theme = theme
            else:
                self.notify(f"The saved theme {theme!r} is not available; using {self.app.theme!r}.",
                            severity="warning", timeout=6, markup=False)
        self.watch(self.app, "theme", self._theme_changed, init=False)
        saved = self._load(self.store.get_setting, "", SETTING_SYSTEM)
        self.default_system = self._system_override if self._system_override is not None else (
            saved if isinstance(saved, str) else "")
        visible = self._load(self.store.get_setting, None, SETTING_DASHBOARD)
        if isinstance(visible, bool):
            self._dashboard_choice = visible
            self._show_dashboard(visible)

    def _theme_changed(self, theme: str) -> None:
        self._save(self.store.set_setting, SETTING_THEME, theme)

    # ---- chats -------------------------------------------------------------------------------------
    async def _show_chat(self, chat_id: int | None, announce: bool = False) -> None:
        """Open the saved chat ``chat_id`` (None: a new, empty chat) in place of the current one;
        ``announce``: say so where it last ran another model or strategy (:meth:`_ran_with_notice`)."""
        lost = self._retry_unsaved()  # the chat being left: its unsaved messages, a last try
        if lost:
            self.notify(f"{lost} message{'s' if lost != 1 else ''} of the chat you left could not be saved "
                        "(see the earlier \"Chat not saved\" notice).", severity="warning", timeout=10)
        records = self._load(self.store.messages, [], chat_id) if chat_id is not None else []
        record = self._load(self.store.chat, None, chat_id) if chat_id is not None else None
        if record is None:
            chat_id, records = None, []
        self.chat_id = chat_id
        self._saved_n = len(records)
        self._unsaved_stats.clear()
        if self._editing is not None:  # an edit of the chat left ends: the prompt gets its draft back
            self._editing = None
            self._restore_draft()
        self.chat_title = record.title if record is not None else ""
        self._kept_title = ""
        self.dashboard.start_reply()  # the last reply's numbers belonged to the chat left
        self.conversation = [{"role": m.role, "content": m.content} for m in records]
        shown = [(m.role, m.content, m.finish_reason) for m in records]
        if chat_id is None and self.default_system:  # a new chat starts with the default system prompt
            self.conversation = [{"role": "system", "content": self.default_system}]
            shown = [("system", self.default_system, None)]
        await self.query_one(MessageList).show(shown)
        self._show_title()
        if self.conversation and self.conversation[-1]["role"] == "user":
            self.notify(self._keys("The last message has no reply (the app closed while it was being written): "
                                   "press {regenerate} to ask again."), severity="warning", timeout=8)
        ran_with = self._ran_with_notice(record) if announce and record is not None else None
        if ran_with is not None:
            self.notify(ran_with, timeout=10, markup=False)
        status = self.status_line.status
        status.last_event = status.summary = None
        if self.session is not None:
            status.state = self._idle_state()
        self.status_line.refresh()

    def _ran_with_notice(self, record: ChatRecord) -> str | None:
        """What an opened chat last ran with and what its next reply will use, where they differ
        (its replies so far came from another model or strategy, which nothing said; no other model
        is loaded for it); None where they match, no model is loaded, or the chat recorded none. A
        strategy saved damaged, or that no longer validates, is left out of the notice."""
        session = self.session
        if session is None or not record.model:
            return None
        label = strategy_label(session)
        try:
            saved: str | None = strategy_label(session, strategy_from_dict(record.strategy)) if record.strategy else None
        except (StrategyError, ValueError):
            saved = None
        if record.model == session.description and (saved is None or saved == label):
            return None
        if saved is None:
            return f"This chat last ran {record.model}; replies now come from {session.description}."
        return f"This chat last ran {record.model} with {saved}; replies now come from {session.description} with {label}."

    def _keys(self, template: str, **values: object) -> str:
        """A notice naming keys by binding id, with the keys the user's keymap gives them (app/keys.py)."""
        return app_keys(self, template, **values)

    def _show_title(self) -> None:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(self.chat_title or NEW_CHAT_TITLE, style="bold")
        text.append(self._keys("  {toggle_chats} chats · {new_chat} new"), style="dim")
        self.title_bar.update(text)

    def _refuse_while_busy(self, doing: str) -> bool:
        """True (with a notice) while a reply runs: chats change only between replies."""
        if self.stopping:
            self.notify(STOPPING_NOTICE, severity="warning", timeout=3)
        elif self.busy:
            self.notify(self._keys("A reply is still running: press {stop} to stop it before {doing}.", doing=doing), severity="warning")
        return self.busy

    async def action_new_chat(self) -> None:
        """Ctrl+N: start a new chat (saved once its first message is sent)."""
        if self._refuse_while_busy("starting a new chat"):
            return
        self._hide_chats()
        if self.chat_id is None and not self._has_user_message:
            self.notify("This is already a new chat.", timeout=3)
            return
        await self._show_chat(None)

    def action_toggle_chats(self) -> None:
        """Ctrl+L / F4: show the chat list (focused), or hide it."""
        if self.chat_list.display:
            self._hide_chats()
            return
        self.chat_list.show_chats(self._load(self.store.chats, [], self.chat_list.search), self.chat_id)
        if self.dashboard.display:
            column = self.query_one("#chat-column").outer_size.width
            if column - self.chat_list.styles.width.value < CHAT_MIN_WIDTH:  # type: ignore[union-attr]
                self._show_dashboard(False)  # the list and the dashboard would crush the messages
                self._dashboard_for_list = True
        self.chat_list.display = True
        self.chat_list.focus_list()

    def _hide_chats(self) -> None:
        if self.chat_list.display:
            self.chat_list.display = False
            self.chat_list.reset_search()
            self.prompt.focus()
            if self._dashboard_for_list:  # hidden to make room for the list: back where it fits
                self._dashboard_for_list = False
                self._apply_width(self.app.size.width)

    @on(ChatList.Opened)
    async def _chat_opened(self, event: ChatList.Opened) -> None:
        if event.chat_id is None:
            await self.action_new_chat()
        elif event.chat_id == self.chat_id:
            self._hide_chats()
        elif not self._refuse_while_busy("switching chats"):
            self._hide_chats()
            await self._show_chat(event.chat_id, announce=True)

    @on(ChatList.Closed)
    def _chats_closed(self) -> None:
        self._hide_chats()

    @on(ChatList.Searched)
    def _chats_searched(self, event: ChatList.Searched) -> None:
        self.chat_list.show_chats(self._load(self.store.chats, [], event.query), self.chat_id)

    @on(ChatList.Renamed)
    def _chat_renamed(self, event: ChatList.Renamed) -> None:
        try:
            self.store.rename_chat(event.chat_id, event.title)
        except StoreError as exc:  # (the title line took the new name the file did not keep)
            self.notify(str(exc), title="Chat not renamed", severity="error", timeout=10, markup=False)
            self.chat_list.focus_list()
            return
        if event.chat_id == self.chat_id:
            self.chat_title = event.title
            self._show_title()
        self.chat_list.show_chats(self._load(self.store.chats, [], self.chat_list.search), self.chat_id, highlight=event.chat_id)
        self.chat_list.focus_list()

    @on(ChatList.Deleted)
    async def _chat_deleted(self, event: ChatList.Deleted) -> None:
        current = event.chat_id == self.chat_id
        if current and self._refuse_while_busy("deleting this chat"):
            return
        try:
            self.store.delete_chat(event.chat_id)
        except StoreError as exc:  # (it said "Chat deleted." and closed the chat, still in the file)
            self.notify(str(exc), title="Chat not deleted", severity="error", timeout=10, markup=False)
            return
        if current:
            self.conversation.clear()  # deleted on purpose: nothing of it waits to be saved
            await self._show_chat(None)
        self.prompt.set_history(self._load(self.store.prompt_history, []))
        self.chat_list.show_chats(self._load(self.store.chats, [], self.chat_list.search), self.chat_id)
        self.chat_list.focus_list()
        self.notify("Chat deleted.", timeout=3)

    # ---- dashboard -------------------------------------------------------------------------------
    def on_resize(self, event: events.Resize) -> None:
        self._apply_width(event.size.width)

    def _apply_width(self, width: int) -> None:
        """Show the dashboard on wide terminals; crossing the threshold resets the user's toggle."""
        wide = width >= DASHBOARD_MIN_WIDTH
        if wide != self._wide:
            self._wide, self._dashboard_choice = wide, None
        visible = wide if self._dashboard_choice is None else self._dashboard_choice
        visible = visible and self._dashboard_fits(width)  # the choice stays: back when the terminal widens
        # as the list's opening does (back when it closes), whether the dashboard is shown by width or
        # by the user's Ctrl+D: a resize brought a chosen one back beside the open list (at 80 columns
        # the messages kept 4, and the prompt's placeholder, wrapped at width 0, ended the app)
        if visible and self.chat_list.display and self._crushes_messages(width):
            visible, self._dashboard_for_list = False, True
        self._show_dashboard(visible)

    def _dashboard_width(self) -> int:
        return int(self.dashboard.styles.width.value) if self.dashboard.styles.width is not None else 0

    def _dashboard_fits(self, width: int) -> bool:
        """Whether the messages keep BESIDE_DASHBOARD_MIN_WIDTH columns beside the dashboard."""
        return width - self._dashboard_width() >= BESIDE_DASHBOARD_MIN_WIDTH

    def _crushes_messages(self, width: int) -> bool:
        """Whether the chat list and the dashboard side by side leave the messages under
        CHAT_MIN_WIDTH columns in a terminal ``width`` columns wide."""
        taken = sum(w.styles.width.value for w in (self.chat_list, self.dashboard) if w.styles.width is not None)
        return width - taken < CHAT_MIN_WIDTH

    def _show_dashboard(self, visible: bool) -> None:
        was = self.dashboard.display
        if not visible and self.focused is not None and self.dashboard in self.focused.ancestors_with_self:
            self.prompt.focus()  # never leave the focus on a hidden widget
        self.dashboard.display = visible
        if visible and not was:
            self.dashboard.flush()

    def action_toggle_dashboard(self) -> None:
        """Ctrl+D / F3: show or hide the dashboard (on a terminal narrower than 100 columns too, as
        long as the messages keep BESIDE_DASHBOARD_MIN_WIDTH columns beside it); remembered."""
        if not self.dashboard.display and not self._dashboard_fits(self.size.width):
            self.notify(f"The dashboard needs {self._dashboard_width() + BESIDE_DASHBOARD_MIN_WIDTH} columns beside the chat; "
                        f"this terminal has {self.size.width}.", severity="warning", timeout=4)
            return
        if not self.dashboard.display and self.chat_list.display and self._crushes_messages(self.size.width):
            needed = self.size.width - self.query_one("#chat-column").outer_size.width + self._dashboard_width() + CHAT_MIN_WIDTH
            self.notify(self._keys("The chat list and the dashboard side by side need {needed} columns; this terminal has "
                                   "{width}: close the list ({toggle_chats}) first.", needed=needed, width=self.size.width),
                        severity="warning", timeout=4)
            return
        self._dashboard_for_list = False
        self._dashboard_choice = not self.dashboard.display
        self._show_dashboard(self._dashboard_choice)
        self._save(self.store.set_setting, SETTING_DASHBOARD, self._dashboard_choice)

    # ---- session and status ----------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """A reply is in flight (from Enter until its last event has been shown)."""
        return self._run is not None

    @property
    def stopping(self) -> bool:
        """A reply is in flight but ending: Esc was pressed (the engine ends after its current step),
        or its last event has come and it is being saved."""
        return self._run is not None and (self._run.stop.is_set() or self._finishing)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Esc is shown dimmed in the footer while no reply is running (and no edit is open)."""
        if action == "stop":
            return True if self.busy or self._editing is not None else None
        return True

    def attach_session(self, session: ChatEngine | None, error: str | None = None) -> None:
        """Chat with ``session`` from now on (None and ``error``: the load failed)."""
        self.session, self.session_error = session, error
        if session is not None and self.restore_strategy:
            self._apply_saved_strategy(session)
        if session is not None and self._sampling:
            self._apply_sampling(session)
        status = self.status_line.status
        self.dashboard.context_length = getattr(session, "context_length", None)
        if session is not None:
            status.model, status.state = session.description, "ready"
            status.strategy = strategy_label(session)
        else:
            status.model, status.strategy, status.state = "No model loaded", "", "load failed"
        self.status_line.refresh()
        # the chat open when the model comes (at start-up: the last one, which on_mount opens, mostly
        # before a model is loaded) may have run another one: say so, as opening it from the list does
        record = self._load(self.store.chat, None, self.chat_id) if session is not None and self.chat_id is not None else None
        ran_with = self._ran_with_notice(record) if record is not None and self.conversation else None
        if ran_with is not None:
            self.notify(ran_with, timeout=10, markup=False)

    def _apply_saved_strategy(self, session: ChatEngine) -> None:
        """The strategy last picked with Ctrl+S / F2, if this session can run it (else a notice)."""
        saved = self._load(self.store.get_setting, None, SETTING_STRATEGY)
        if saved is None:
            return
        try:
            session.strategy = strategy_from_dict(saved).validate(has_drafter_model=session.has_drafter)
        except (StrategyError, ValueError) as exc:
            why = in_app(str(exc), self._keys("{models}"))  # the app's advice, not the command line's flags
            self.notify(f"Saved strategy not used: {why}; using {strategy_label(session)}",
                        severity="warning", timeout=8, markup=False)

    def _apply_sampling(self, session: ChatEngine) -> None:
        """The command line's sampling flags over the session's strategy, or a notice naming what
        refused them. Once, for the first model, as ``--strategy`` is (a model loaded later takes
        the saved strategy; a live pick saves the current one, flags and all)."""
        sampling, self._sampling = self._sampling, {}
        try:
            session.strategy = session.strategy.replace(**sampling).validate(has_drafter_model=session.has_drafter)
        except (StrategyError, ValueError) as exc:
            self.notify(f"Sampling flags not used: {exc}; using {strategy_label(session)}",
                        severity="warning", timeout=8, markup=False)

    def show_strategy(self) -> None:
        """Show the session's current strategy (after a live switch) and remember it: saved, and
        applied to the models loaded later where they can run it (``--strategy`` chose only the
        first model's: reapplied at each switch, it undid the choice made since)."""
        if self.session is not None:
            self.status_line.status.strategy = strategy_label(self.session)
            self.status_line.refresh()
            self._save(self.store.set_setting, SETTING_STRATEGY, self.session.strategy.to_dict())
            self.restore_strategy = True

    def _set_state(self, state: str) -> None:
        self.status_line.status.state = state
        self.status_line.refresh()

    def _idle_state(self) -> str:
        """The status line's state with no reply running: "ready", or the model picked with Ctrl+O
        loading (sends wait for it)."""
        switching = getattr(self.app, "switching_to", None)
        return f"loading {switching.target}…" if switching is not None else "ready"

    def show_loading(self, target: str | None) -> None:
        """A model picked with Ctrl+O is loading (``target``), or that load ended without a switch
        (None: it failed, or was dropped): the status line says so (it said "ready" beside the old
        model while every send was refused until the new one was ready)."""
        self._set_state(f"loading {target}…" if target is not None else "ready")

    def _ready_to_generate(self) -> bool:
        """True if a reply can start now; otherwise says why."""
        if self.busy:
            if self.stopping:  # ("press Esc to stop it", once Esc was pressed, named a key that did nothing more)
                self.notify(STOPPING_NOTICE, severity="warning", timeout=3)
            else:
                self.notify(self._keys(BUSY_NOTICE), severity="warning")
            return False
        switching = getattr(self.app, "switching_to", None)
        if switching is not None:  # the new model would be attached in the middle of the reply
            self.notify(f"Loading {switching.target}: send when it is ready.", severity="warning", markup=False)
            return False
        if self.session is None:
            if self.session_error is None:
                self.notify("The model is still loading…", severity="warning")
            else:
                self.notify(f"No model loaded: {self.session_error}", severity="error", markup=False)
            return False
        return True

    @on(PromptInput.ScrollConversation)
    def _scroll_conversation(self, event: PromptInput.ScrollConversation) -> None:
        """PageUp / PageDown from the prompt: a page of the conversation (scrolling up while a reply
        streams lets go of the bottom; back at the bottom it follows the reply again)."""
        messages = self.query_one(MessageList)
        if event.pages < 0:
            messages.scroll_page_up(animate=False)
        elif messages.scroll_y + messages.scrollable_content_region.height >= messages.max_scroll_y:
            messages.anchor()  # the last page: at the bottom, following the reply again
        else:
            messages.scroll_page_down(animate=False)

    # ---- sending ---------------------------------------------------------------------------------
    @on(PromptInput.Submitted)
    async def _send(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            self.notify("Type a message first.", timeout=3)
            return
        if self.stopping and self._editing is None:
            # Esc, then Enter: the message goes once the reply has stopped (it was refused with "press
            # Esc to stop it", the reply already stopping, and Enter had to be pressed again)
            self._send_when_stopped = True
            self.notify(QUEUED_NOTICE, timeout=3)
            return
        if not self._ready_to_generate():
            return
        event.prompt.clear()
        event.prompt.remember(text)
        if self._editing is not None:  # replaces the last message and everything after it (its reply)
            keep, self._editing = self._editing, None
            self._restore_draft()
            shown = len(self.conversation)
            self._edited = (keep, self._messages_from(keep))  # back if the new reply brings nothing (_finish)
            del self.conversation[keep:]
            self._drop_messages_from(keep)
            await self.query_one(MessageList).remove_last(shown - keep)
        self.conversation.append({"role": "user", "content": text})
        self._save_message("user", text)
        await self.query_one(MessageList).add_message("user", text)
        await self._start_reply()

    def _messages_from(self, start: int) -> list[tuple[str, str, dict[str, Any] | None]]:
        """The conversation's messages from index ``start`` on, each with its saved stats (a reply's
        finish mark as shown, where the chat is not saved)."""
        saved = self._load(self.store.messages, [], self.chat_id) if self.chat_id is not None else []
        shown = self.query_one(MessageList)  # (by the chat's index: its first messages may not be mounted)
        out: list[tuple[str, str, dict[str, Any] | None]] = []
        for i, m in enumerate(self.conversation[start:], start=start):
            stats = saved[i].stats if i < len(saved) and (saved[i].role, saved[i].content) == (m["role"], m["content"]) else None
            reason = shown.finish_reason_at(i) if stats is None and m["role"] == "assistant" else None
            if reason:
                stats = {"finish_reason": reason}
            out.append((m["role"], m["content"], stats))
        return out

    async def action_regenerate(self) -> None:
        """Ctrl+R: drop the last reply and ask again (with the strategy now selected).

        A chat whose last message has no reply (the app was killed mid-reply) is simply answered.
        """
        if not self._has_user_message:
            self.notify("Nothing to regenerate yet: send a message first.", timeout=4)
            return
        if not self._ready_to_generate():
            return
        if self._editing is not None:  # the send would then replace the new reply too
            self.notify(self._keys(EDIT_OPEN_NOTICE), severity="warning", timeout=4)
            return
        if self.conversation[-1]["role"] == "assistant":
            self._replaced = (self.conversation.pop()["content"], self._last_reply_stats())
            self._drop_messages_from(len(self.conversation))
            await self.query_one(MessageList).remove_last()
        assert self.session is not None
        self.notify(f"Regenerating with {strategy_label(self.session)}.", timeout=3)
        await self._start_reply()

    async def _start_reply(self) -> None:
        """Ask the engine to answer the conversation (which ends with the user's message)."""
        session = self.session
        assert session is not None
        run = ReplyRun(self.conversation, self.max_new_tokens)
        self._run, self._reply_saved = run, False
        self.refresh_bindings()
        before = ""
        if self._continuing is not None:  # the reply goes on in a fresh widget (without its end mark)
            before = self._continuing[0]
            await self.query_one(MessageList).remove_last()
        self._reply = await self.query_one(MessageList).add_message("assistant", before)
        status = self.status_line.status
        status.last_event, status.summary = None, run.summary
        self._set_state(READING_STATE)  # until the first step: the prompt's prefill (seconds for a long one)
        self.dashboard.start_reply()
        self._timer = self.set_interval(FRAME_INTERVAL_S, self._drain)
        if not self._gc_held:  # no full collection (GIL held for tens of ms) while the engine decodes
            self._gc_held = True
            FULL_COLLECTIONS.hold()
        self._generate(session, run)

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def _generate(self, session: ChatEngine, run: ReplyRun) -> None:
        """Engine thread: run the decode loop; ``run.pump`` only queues events, never raises."""
        worker = get_current_worker()
        run.pump(session, lambda: worker.is_cancelled)

    # ---- streaming -------------------------------------------------------------------------------
    async def _drain(self) -> None:
        """UI thread, once a frame: the engine's new events and text, shown all at once: the
        dashboard's repaint, the status line and the reply's new Markdown in one batch, so that
        Textual lays the screen out and renders it once for all of them. (Written through a
        MarkdownStream, whose task appended the text after the frame's other updates, a frame took
        ~2.7 renders and ~2.2 layouts, ~80 ms of UI CPU on the 2-core EPYC, time the decode
        threads lost: bench/results/2026-11-29-session38.)"""
        run = self._run
        reply = self._reply
        if run is None or reply is None:  # (_finish stops the frames' timer before the reply closes)
            return
        with self.app.batch_update():
            new_text = run.drain()
            if run.new_events:
                self.dashboard.add_events(run.new_events)
                self.dashboard.frame()
            if run.last_event is not None:
                status = self.status_line.status
                status.last_event = run.last_event
                if status.state == READING_STATE:
                    status.state = "generating…"
                self.status_line.refresh()
            if new_text:
                await reply.append(new_text)  # the Markdown's lock orders it with the final update
        if run.dropped_messages and self._window_shown != (self.chat_id, run.dropped_messages):
            self._window_shown = (self.chat_id, run.dropped_messages)  # once a cut, not every turn
            context = getattr(self.session, "context_length", 0) or 0
            self.notify(window_notice(context, run.dropped_messages), timeout=8)
        if run.finished and not self._finishing:
            # Finish on the screen's message loop: _finish stops this timer, which must not
            # cancel the task it is running in.
            self._finishing = True
            self.call_later(self._finish, run)

    def _ar_baseline(self, run: ReplyRun, failed: bool) -> None:
        """A reply decoded with plain decoding (``ar``) throughout, of AR_BASELINE_MIN_TOKENS or
        more, becomes the dashboard's speedup reference: measured in the app, beside the UI
        thread's work, like the replies it is compared with (the load-time measure runs with the
        UI idle, so it is faster than any in-app rate: ~0.75x in q8, bench/app_stream.py)."""
        from ..widgets.dashboard import BaselineInfo

        n = run.summary.new_tokens
        if failed or not run.only_ar or n < AR_BASELINE_MIN_TOKENS or run.summary.tokens_per_s <= 0:
            return
        # its context goes with it, and the load-time fit (a step's time against the context) stays: a
        # reply at another context is compared with plain decoding moved to its own context
        fit = self.dashboard.baseline.fit if self.dashboard.baseline is not None else None
        label = run.last_event.strategy if run.last_event is not None else ""
        sampling = "T=" + label.split(" T=", 1)[1] if " T=" in label else "T=0"  # (Strategy.label ends with it)
        self.dashboard.set_baseline(BaselineInfo(run.summary.tokens_per_s, f"ar in the app, last such reply, {n} tokens",
                                                 fit=fit, context=self.dashboard.stats.mean_context, sampling=sampling))

    def _baseline_for_sampling(self) -> None:
        """The speedup compares like with like: where the replies now sample otherwise than the
        reference's plain decoding did (the temperature, a cut or the penalty changed; a draw and
        the cuts cost a sampled step more than an argmax), plain decoding is measured again that way,
        between replies, on its own cache."""
        b, session = self.dashboard.baseline, self.session
        strategy = getattr(session, "strategy", None)
        if b is None or strategy is None:
            return  # none yet, or one being measured (for the settings of its start)
        if strategy.sampling_label() != b.sampling:
            self.app.measure_baseline("after the sampling changed")  # type: ignore[attr-defined]

    async def _finish(self, run: ReplyRun) -> None:
        """The engine is done: save the reply, show the final text.

        The conversation, the store and the status change before the first await, and the screen
        counts as busy until the end, so a message sent meanwhile is refused rather than sent
        without this reply. A reply that brought nothing back (an error, a full context, or Esc
        before the first token) takes the user's message with it: it goes back into the prompt to
        be sent again (an empty reply would otherwise stay in the chat and be sent to the model as
        the assistant's turn), above what was typed there meanwhile (:meth:`_unsend`). A
        regenerated reply that brought nothing back leaves the reply it was to replace in place
        instead (text, stats, finish mark): nothing is lost.
        """
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._release_gc()
        failed = run.error is not None or run.finish_reason == "error"
        reason = "error" if failed else run.finish_reason
        if self._continuing is not None:
            await self._finish_continued(run, failed, reason)
            return
        nothing_back = not run.text and reason in ("error", "context", "stopped")
        replaced, self._replaced = self._replaced, None
        edited, self._edited = self._edited, None
        restore = nothing_back and replaced is not None  # a regenerate that brought nothing: the old reply stays
        unsent = ""
        kept: list[tuple[str, str, dict[str, Any] | None]] = []  # an edit that brought nothing: what it was to replace
        edit_at = edited[0] if edited is not None else 0
        if restore:
            assert replaced is not None
            self.conversation.append({"role": "assistant", "content": replaced[0]})
            self._save_message("assistant", replaced[0], replaced[1])
        elif nothing_back:
            unsent = self.conversation.pop()["content"]
            self._drop_messages_from(len(self.conversation))
            if edited is not None:  # the edited message and its reply were gone for good (chat and store)
                kept = edited[1]
                for role, content, stats in kept:
                    self.conversation.append({"role": role, "content": content})
                    self._save_message(role, content, stats)
        else:
            self.conversation.append({"role": "assistant", "content": run.text})
            self._save_message("assistant", run.text, reply_stats(run, reason))
        self._reply_saved = True
        self._set_state(FINISH_TEXT.get(reason or "", "done"))
        self._ar_baseline(run, failed)
        self.call_later(self._baseline_for_sampling)  # once the reply is done (not measured as overlapping it)
        if failed:
            self.notify(failure_notice(run), severity="error", timeout=8, markup=False)
        elif reason == "context":  # (a regenerate refused: the message is in the chat, not the prompt, to shorten)
            notice = REGENERATE_TOO_LONG_NOTICE if restore else TOO_LONG_NOTICE if nothing_back else CONTEXT_NOTICE
            self.notify(self._keys(notice), severity="warning", timeout=12)
        elif restore:
            self.notify(REGENERATE_EMPTY_NOTICE, timeout=5)
        elif nothing_back and not kept:
            self.notify(STOPPED_DRAFT_NOTICE if self.prompt.text.strip() else STOPPED_EMPTY_NOTICE, timeout=5)
        elif reason == "length":
            self.notify(LENGTH_NOTICE.format(n=run.max_new_tokens), timeout=6)
        async with self._closing_reply() as reply:
            if restore:
                assert replaced is not None
                column = self.query_one(MessageList)
                await column.remove_last(1)
                await column.add_message("assistant", replaced[0], (replaced[1] or {}).get("finish_reason"))
            elif nothing_back:
                column = self.query_one(MessageList)
                await column.remove_last(2)
                for role, content, stats in kept:
                    await column.add_message(role, content, (stats or {}).get("finish_reason"))
                if kept:
                    self._edit_again(unsent, edit_at)
                    self.notify(self._keys(EDIT_KEPT_NOTICE), timeout=8)
                else:
                    self._unsend(unsent)
            elif reply is not None:
                await reply.finish(run.text, reason)
        self._send_queued(not nothing_back)

    def _send_queued(self, prompt_untouched: bool) -> None:
        """The message Enter sent while the reply was stopping, now that it has stopped: the prompt's
        text, sent as Enter sends it. Not where the stopped reply's own message came back into the
        prompt (``prompt_untouched`` False): the notice then says so, and the prompt waits."""
        queued, self._send_when_stopped = self._send_when_stopped, False
        if queued and prompt_untouched and self.prompt.text.strip():
            self.prompt.post_message(PromptInput.Submitted(self.prompt, self.prompt.text))

    def _unsend(self, message: str) -> None:
        """``message``, sent but answered with nothing, back into the prompt: alone in an empty one
        (the cursor at its end, to send it again), else above the draft typed while it was read,
        a blank line between them and the cursor where it was in the draft (the message used to be
        dropped whenever the prompt was not empty, though the notice said it was back)."""
        prompt = self.prompt
        if not prompt.text.strip():
            prompt.text = message
            prompt.move_cursor(prompt.document.end)
        else:
            prompt.insert(message + "\n\n", (0, 0))

    def _edit_again(self, text: str, index: int) -> None:
        """An edit whose reply brought nothing: open again as before its Enter, ``text`` in the prompt
        to replace the message at ``index`` (kept meanwhile) and its reply; what the prompt holds
        now (the draft from before the edit, and anything typed since) comes back when it ends."""
        self._draft_before_edit = self.prompt.text
        self.prompt.text = text
        self.prompt.move_cursor(self.prompt.document.end)
        self._editing = index
        self._set_state(self._keys(EDITING_STATE))

    @asynccontextmanager
    async def _closing_reply(self) -> AsyncIterator[ChatMessage | None]:
        """The end of a reply on screen: the dashboard's last frame, no more appends, then the
        reply's widget to show the final text in; afterwards (whatever happens) the screen is free."""
        self.dashboard.flush()
        reply = self._reply  # (every drain awaited its append: nothing is left to flush)
        try:
            yield reply
        finally:
            self._run = self._reply = None
            self._finishing = False
            self.refresh_bindings()
            ended = getattr(self.app, "reply_ended", None)  # a model picked during the reply loads now
            if ended is not None:
                ended()

    async def action_continue_reply(self) -> None:
        """Ctrl+P "Continue the last reply": the model goes on from the end of the last reply (cut by
        the token limit, or stopped), in the same message; the engine reads the reply as its own
        unfinished turn (``engine.session.ChatSession.encode_chat``), so greedy decoding with the same
        model writes what it would have written uncut. A continuation that brings nothing back leaves
        the reply as it was."""
        if not self._ready_to_generate():
            return
        if self._editing is not None:
            self.notify(self._keys(EDIT_OPEN_NOTICE), severity="warning", timeout=4)
            return
        last = self.conversation[-1] if self.conversation else None
        if last is None or last["role"] != "assistant" or not last["content"] or not self._has_user_message:
            self.notify("No reply to continue: the chat's last message is not a reply.", timeout=4)
            return
        stats = self._last_reply_stats()
        shown = list(self.query_one(MessageList).query_children(ChatMessage))
        if stats is None and shown:  # not saved: how it ended, from its mark on screen
            stats = {"finish_reason": shown[-1].finish_reason}
        if (stats or {}).get("finish_reason") == "context":
            self.notify("That reply filled the model's context window: it cannot go on.", severity="warning", timeout=6)
            return
        # a reply cut inside a character ends with U+FFFD: the model writes that character again
        self._continuing = (last["content"].rstrip("\ufffd"), stats)
        assert self.session is not None
        self.notify(f"Continuing with {strategy_label(self.session)}.", timeout=3)
        await self._start_reply()

    async def _finish_continued(self, run: ReplyRun, failed: bool, reason: str | None) -> None:
        """:meth:`_finish` for a continued reply: the new text joins the reply (conversation, store,
        screen) with how the continuation ended; nothing new leaves the reply and its mark as they were."""
        assert self._continuing is not None
        before, stats = self._continuing
        self._continuing = None
        text = before + run.text
        shown_reason = reason
        if run.text:
            self._replace_last_reply(text, continued_stats(stats, reply_stats(run, reason)))
            self._ar_baseline(run, failed)
        else:
            text = self.conversation[-1]["content"]
            shown_reason = (stats or {}).get("finish_reason")
        self._reply_saved = True
        self._set_state(FINISH_TEXT.get(reason if failed or run.text else shown_reason or "", "done"))
        self.call_later(self._baseline_for_sampling)  # once the reply is done (not measured as overlapping it)
        if failed:
            self.notify(failure_notice(run), severity="error", timeout=8, markup=False)
        elif not run.text:
            self.notify("The continuation brought nothing back: the reply is as it was.", timeout=5)
        elif reason == "context":
            self.notify(self._keys(CONTEXT_NOTICE), severity="warning", timeout=12)
        elif reason == "length":
            self.notify(LENGTH_NOTICE.format(n=run.max_new_tokens), timeout=6)
        async with self._closing_reply() as reply:
            if reply is not None:
                await reply.finish(text, shown_reason)
        self._send_queued(True)

    def _replace_last_reply(self, text: str, stats: dict[str, Any]) -> None:
        """The last reply becomes ``text`` (a continuation), in the conversation and, in one write,
        in the store: only where the chat still ends with the reply this window has (another window
        that saved a message or continued the same reply meanwhile had it overwritten); else the
        other window's messages stay and this window's conversation goes on in a copy."""
        was = self.conversation[-1]["content"]
        self.conversation[-1]["content"] = text
        if self.chat_id is None:
            return
        try:
            self._save(self.store.replace_last, self.chat_id, "assistant", text, stats, expect=self._saved_n, was=was)
        except ChatChanged:
            self._fork(self.conversation, stats)

    def action_export_chat(self) -> None:
        """Ctrl+P "Export this chat as Markdown": to ``exports/`` beside the chat database (the
        current directory when the chats are in memory); the toast says where."""
        from ..export import close_fences, export_chat

        if not self._has_user_message:
            self.notify("Nothing to export yet: send a message first.", timeout=4)
            return
        folder = self.store.path.parent / "exports" if self.store.path is not None else Path.cwd()
        model = self.session.description if self.session is not None else ""
        conversation = [dict(m) for m in self.conversation]
        run = self._run
        if run is not None and not self._reply_saved:  # a reply streaming (or not yet saved): as far as it got
            note = "\n\n*(still being written when exported)*"  # (after the code block it is in, closed: not code)
            if self._continuing is not None and conversation and conversation[-1]["role"] == "assistant":
                conversation[-1]["content"] = close_fences(self._continuing[0] + run.text) + note
            else:
                conversation.append({"role": "assistant", "content": close_fences(run.text) + note})
        try:
            path = export_chat(folder, self.chat_title, conversation, model)
        except OSError as exc:
            where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""  # which folder or file refused
            self.notify(f"Could not export the chat: {exc.strerror or exc}{where}", severity="error", timeout=8, markup=False)
            return
        count = sum(m["role"] != "system" for m in conversation)
        self.notify(f"Exported {count} message{'s' if count != 1 else ''} to {path}", timeout=8, markup=False)

    # ---- stopping, copying -----------------------------------------------------------------------
    def action_stop(self) -> None:
        """Esc: ask the engine to stop after its current step; the partial reply stays. With no
        reply running, Esc leaves an edit of the last message (the prompt is emptied)."""
        if self._run is not None and not self._finishing and not self._run.stop.is_set():
            self._run.stop.set()
            self._set_state("stopping…")
        elif self._run is None and self._editing is not None:
            self._editing = None
            self._restore_draft()
            self._set_state(self._idle_state())
            self.notify("Edit cancelled.", timeout=3)

    def action_copy_text(self) -> None:
        """Ctrl+C (Textual's Screen binding, after the prompt's own copy of a selection in it): the
        text selected on the screen to the clipboard, as Textual does; with none, while a reply runs,
        stop it as Esc does (the terminal's interrupt answered "Do you want to quit? Press Ctrl+Q"
        and the reply ran on); else Textual's quit hint, as before."""
        selection = self.get_selected_text()
        if selection:
            self.app.copy_to_clipboard(selection)
        elif self._run is not None and not self._finishing:
            if not self._run.stop.is_set():
                self.action_stop()
        else:
            raise SkipAction()

    def _restore_draft(self) -> None:
        """The prompt as it was before "Edit the last message" (a half-written message is not lost)."""
        draft, self._draft_before_edit = self._draft_before_edit, ""
        self.prompt.text = draft
        self.prompt.move_cursor(self.prompt.document.end)

    def action_edit_last(self) -> None:
        """Ctrl+P "Edit the last message": the last message you sent goes into the prompt; sending
        it replaces that message and its reply (from the chat and the saved history); Esc cancels."""
        if not self._ready_to_generate():
            return
        users = [i for i, m in enumerate(self.conversation) if m["role"] == "user"]
        if not users:
            self.notify("Nothing to edit yet: send a message first.", timeout=4)
            return
        if self._editing is None:  # (a second "Edit" keeps the first one's draft, not the text being edited)
            self._draft_before_edit = self.prompt.text  # what was typed: back in the prompt when the edit ends
        self._editing = users[-1]
        self._hide_chats()
        self.prompt.text = self.conversation[users[-1]]["content"]
        self.prompt.move_cursor(self.prompt.document.end)
        self.prompt.focus()
        self._set_state(self._keys(EDITING_STATE))

    def action_system_prompt(self) -> None:
        """Ctrl+P "System prompt…": edit this chat's system prompt (and, ticked, new chats')."""
        if self._refuse_while_busy("changing the system prompt"):
            return
        if self._editing is not None:
            self.notify(self._keys(EDIT_OPEN_NOTICE), severity="warning", timeout=4)
            return
        current = self._system_text
        # ticked for a new chat, or a chat that uses the default one (a change then goes on to new chats)
        for_new = not self._has_user_message or (bool(current) and current == self.default_system)
        self.app.push_screen(SystemPromptScreen(current, for_new), self._system_chosen)

    async def _system_chosen(self, result: tuple[str, bool] | None) -> None:
        if result is None or self._refuse_while_busy("changing the system prompt"):
            return
        text, for_new = result
        if for_new and text != self.default_system:
            self.default_system = text
            self._save(self.store.set_setting, SETTING_SYSTEM, text)
        current = self._system_text
        if text == current and (not for_new or text == self.default_system):
            self.notify("System prompt unchanged.", timeout=3)
            return
        if text != current:
            changed = False  # another window wrote to this chat: the new prompt goes to a copy of this window's
            if self.chat_id is not None:
                try:
                    self.store.set_system(self.chat_id, text, expect=self._saved_n, was=current)
                    # the saved chat gained or lost its message 0: so does this window's count of it
                    # (and the indices of messages still waiting to be saved move with the conversation)
                    shift = int(bool(text)) - int(bool(current))
                    self._saved_n += shift
                    self._unsaved_stats = {i + shift: v for i, v in self._unsaved_stats.items()}
                except ChatChanged:
                    changed = True
                except StoreError as exc:
                    self.notify(str(exc), title="System prompt not changed", severity="error", timeout=10, markup=False)
                    return
            mine = self._messages_from(self._n_system) if changed else []  # (with their finish marks, for the copy's screen)
            del self.conversation[: self._n_system]
            if text:
                self.conversation.insert(0, {"role": "system", "content": text})
            if changed:  # (not reloaded from the store: that would show the other window's messages as this one's)
                self._fork(self.conversation, mine[-1][2] if mine else None)
                await self.query_one(MessageList).show(
                    [("system", text, None)] * bool(text) + [(r, c, (st or {}).get("finish_reason")) for r, c, st in mine])
            elif self.chat_id is not None:
                await self._show_chat(self.chat_id)  # from the store: the messages keep their finish marks
            else:
                await self.query_one(MessageList).show((m["role"], m["content"], None) for m in self.conversation)
        where = "this chat and new chats" if for_new else "this chat"
        self.notify(f"System prompt {'set' if text else 'cleared'} for {where}.", timeout=4)

    def action_copy_reply(self) -> None:
        """Ctrl+Y: the last reply to the clipboard (OSC 52, as Textual copies); while a reply is being
        written, that reply as far as it is shown (it copied the one before, saying "the last reply")."""
        run = self._run
        if run is not None and not self._reply_saved:  # streaming: what the screen shows of it
            reply = (self._continuing[0] if self._continuing is not None else "") + run.text
            if not reply:
                self.notify("The reply being written has no text yet: nothing copied.", timeout=3)
                return
            what = "the reply being written, as far as it has come"
        else:
            reply = next((m["content"] for m in reversed(self.conversation) if m["role"] == "assistant"), "")
            what = "the last reply"
        if not reply:
            self.notify("No reply to copy yet.", timeout=3)
            return
        self.app.copy_to_clipboard(reply)
        self.notify(f"Copied {what} ({len(reply)} characters){',' if run is not None and not self._reply_saved else ''} with OSC 52; "
                    "if it does not paste, your terminal does not allow OSC 52.", timeout=5)

    def _release_gc(self) -> None:
        if self._gc_held:
            self._gc_held = False
            FULL_COLLECTIONS.release()

    def on_unmount(self) -> None:
        """Quitting mid-reply: stop the engine, save what came so far as a stopped reply (or, with
        nothing yet, the reply a regenerate was replacing, the exchange an edit was replacing), close
        the store."""
        self._release_gc()
        run = self._run
        if run is None:
            self._retry_unsaved()  # (quitting: the last chance for messages a failed write left unsaved)
        if run is not None:
            run.stop.set()
            if not self._reply_saved:
                run.drain()
                if self._continuing is not None:  # quit while continuing a reply: it keeps what came
                    if run.text:
                        self._reply_saved = True
                        self._replace_last_reply(self._continuing[0] + run.text,
                                                 continued_stats(self._continuing[1], reply_stats(run, "stopped")))
                elif run.text:
                    self._reply_saved = True
                    self._save_message("assistant", run.text, reply_stats(run, "stopped"))
                elif self._replaced is not None:  # quit during a regenerate with nothing yet: keep the old reply
                    self._save_message("assistant", *self._replaced)
                elif self._edited is not None:  # quit during an edit's reply with nothing yet: as _finish does,
                    # the message it was to replace and that message's reply stay (they were deleted at send)
                    keep, kept = self._edited
                    self._drop_messages_from(keep)
                    del self.conversation[keep:]
                    for role, content, stats in kept:
                        self.conversation.append({"role": role, "content": content})
                        self._save_message(role, content, stats)
        self.store.close()
