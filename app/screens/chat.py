"""The chat screen: messages, the prompt, the live dashboard, the status line, the reply in flight."""

from __future__ import annotations

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer
from textual.widgets.markdown import MarkdownStream
from textual.worker import get_current_worker

from engine.session import ChatEngine

from ..reply import ReplyRun
from ..widgets import ChatMessage, Dashboard, MessageList, PromptInput, StatusLine
from ..widgets.status import FINISH_TEXT

DRAIN_INTERVAL_S = 1 / 20  # the UI takes the engine's events at most 20 times a second
STOPPED_MARK = "\n\n*(stopped)*"
ERROR_MARK = "\n\n*(error)*"
DASHBOARD_MIN_WIDTH = 100  # narrower terminals start with the dashboard hidden (the key still shows it)


class ChatScreen(Screen[None]):
    """One conversation with the session the app hands over through :meth:`attach_session`.

    The conversation (a list of {"role", "content"}) is sent whole every turn. The engine runs in
    a thread worker; this screen only drains its queue on a timer (see :mod:`app.reply`).
    """

    BINDINGS = [
        Binding("escape", "stop", "Stop", id="stop"),
        Binding("ctrl+d,f3", "toggle_dashboard", "Dashboard", id="toggle_dashboard", priority=True),
    ]

    def __init__(self, max_new_tokens: int = 512, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.max_new_tokens = max_new_tokens
        self.session: ChatEngine | None = None
        self.session_error: str | None = None
        self.conversation: list[dict[str, str]] = []
        self.status_line = StatusLine(id="status")
        self._run: ReplyRun | None = None
        self._reply: ChatMessage | None = None
        self._stream: MarkdownStream | None = None
        self._timer: Timer | None = None
        self._finishing = False
        self.dashboard = Dashboard(id="dashboard")
        self._dashboard_choice: bool | None = None  # the user's toggle; None: by terminal width
        self._wide: bool | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            with Vertical(id="chat-column"):
                yield MessageList(id="messages")
                yield PromptInput(id="prompt")
            yield self.dashboard
        yield self.status_line
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(PromptInput).focus()
        self._apply_width(self.app.size.width)

    # ---- dashboard -------------------------------------------------------------------------------
    def on_resize(self, event: events.Resize) -> None:
        self._apply_width(event.size.width)

    def _apply_width(self, width: int) -> None:
        """Show the dashboard on wide terminals; crossing the threshold resets the user's toggle."""
        wide = width >= DASHBOARD_MIN_WIDTH
        if wide != self._wide:
            self._wide, self._dashboard_choice = wide, None
        self._show_dashboard(wide if self._dashboard_choice is None else self._dashboard_choice)

    def _show_dashboard(self, visible: bool) -> None:
        was = self.dashboard.display
        if not visible and self.focused is not None and self.dashboard in self.focused.ancestors_with_self:
            self.query_one(PromptInput).focus()  # never leave the focus on a hidden widget
        self.dashboard.display = visible
        if visible and not was:
            self.dashboard.flush()

    def action_toggle_dashboard(self) -> None:
        """Ctrl+D / F3: show or hide the dashboard (whatever the terminal width)."""
        self._dashboard_choice = not self.dashboard.display
        self._show_dashboard(self._dashboard_choice)

    # ---- session and status ----------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """A reply is in flight (from Enter until its last event has been shown)."""
        return self._run is not None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Esc is shown dimmed in the footer while no reply is running."""
        if action == "stop":
            return True if self.busy else None
        return True

    def attach_session(self, session: ChatEngine | None, error: str | None = None) -> None:
        """Chat with ``session`` from now on (None and ``error``: the load failed)."""
        self.session, self.session_error = session, error
        status = self.status_line.status
        if session is not None:
            status.model, status.state = session.description, "ready"
            status.strategy = session.strategy.label()
        else:
            status.model, status.strategy, status.state = "No model loaded", "", "load failed"
        self.status_line.refresh()

    def show_strategy(self) -> None:
        """Show the session's current strategy (after a live switch)."""
        if self.session is not None:
            self.status_line.status.strategy = self.session.strategy.label()
            self.status_line.refresh()

    def _set_state(self, state: str) -> None:
        self.status_line.status.state = state
        self.status_line.refresh()

    # ---- sending ---------------------------------------------------------------------------------
    @on(PromptInput.Submitted)
    async def _send(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            self.notify("Type a message first.", timeout=3)
            return
        if self.busy:
            self.notify("A reply is still running: wait for it, or press Esc to stop it.", severity="warning")
            return
        if self.session is None:
            if self.session_error is None:
                self.notify("The model is still loading…", severity="warning")
            else:
                self.notify(f"No model loaded: {self.session_error}", severity="error")
            return
        event.prompt.clear()
        self.conversation.append({"role": "user", "content": text})
        run = ReplyRun(self.conversation, self.max_new_tokens)
        self._run = run
        self.refresh_bindings()
        messages = self.query_one(MessageList)
        await messages.add_message("user", text)
        self._reply = await messages.add_message("assistant")
        self._stream = ChatMessage.get_stream(self._reply)
        status = self.status_line.status
        status.last_event, status.summary = None, run.summary
        self._set_state("generating…")
        self.dashboard.start_reply()
        self._timer = self.set_interval(DRAIN_INTERVAL_S, self._drain)
        self._generate(self.session, run)

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def _generate(self, session: ChatEngine, run: ReplyRun) -> None:
        """Engine thread: run the decode loop; ``run.pump`` only queues events, never raises."""
        worker = get_current_worker()
        run.pump(session, lambda: worker.is_cancelled)

    # ---- streaming -------------------------------------------------------------------------------
    async def _drain(self) -> None:
        """UI thread, on the timer: one Markdown write and one status refresh per drain."""
        run = self._run
        if run is None or self._stream is None:
            return
        new_text = run.drain()
        if run.new_events:
            self.dashboard.add_events(run.new_events)
        if new_text:
            await self._stream.write(new_text)
        if run.last_event is not None:
            self.status_line.status.last_event = run.last_event
            self.status_line.refresh()
        if run.finished and not self._finishing:
            # Finish on the screen's message loop: _finish stops this timer, which must not
            # cancel the task it is running in.
            self._finishing = True
            self.call_later(self._finish, run)

    async def _finish(self, run: ReplyRun) -> None:
        """The engine is done: flush the stream, show the final text, update the conversation.

        The conversation and status change before the first await, and the screen counts as busy
        until the end, so a message sent meanwhile is refused rather than sent without this reply.
        """
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        failed = run.error is not None or run.finish_reason == "error"
        if run.text or not failed:
            self.conversation.append({"role": "assistant", "content": run.text})
        else:
            self.conversation.pop()  # nothing came back: the user can send the message again
        reason = run.finish_reason
        self._set_state(FINISH_TEXT.get(reason or "", "done"))
        if failed:
            self.notify(f"Generation failed: {run.error or 'the engine reported an error'}",
                        severity="error", timeout=8)
        elif reason == "context":
            self.notify("Context full: the conversation no longer fits the model's context.",
                        severity="warning", timeout=8)
        self.dashboard.flush()
        reply, stream = self._reply, self._stream
        try:
            if stream is not None:
                await stream.stop()
            if reply is not None:
                mark = STOPPED_MARK if run.stopped else ERROR_MARK if failed else ""
                await reply.update(run.text + mark)
                reply.set_class(run.stopped, "-stopped")
                reply.set_class(failed, "-error")
        finally:
            self._run = self._reply = self._stream = None
            self._finishing = False
            self.refresh_bindings()

    # ---- stopping --------------------------------------------------------------------------------
    def action_stop(self) -> None:
        """Esc: ask the engine to stop after its current step; the partial reply stays."""
        if self._run is not None and not self._finishing and not self._run.stop.is_set():
            self._run.stop.set()
            self._set_state("stopping…")

    def on_unmount(self) -> None:
        if self._run is not None:
            self._run.stop.set()
