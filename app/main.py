"""SpecChatApp: the Textual app. It loads the engine session in a thread and hosts the screens.

    from app.main import run_app
    run_app(lambda: ChatSession.load(target="smollm2-135m-instruct"), max_new_tokens=256)

The factory is called inside a worker thread, so the app itself never imports torch; it only
knows the torch-free contracts in engine.events, engine.strategy and engine.session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual import work
from textual.app import App
from textual.binding import Binding

from engine.session import ChatEngine
from engine.strategy import Strategy

from .messages import SessionFailed, SessionLoaded, error_line
from .screens import ChatScreen, HelpScreen
from .strategy_cycle import next_preset

SessionFactory = Callable[[], ChatEngine]


class SpecChatApp(App[None]):
    """A chat with a speculative-decoding engine.

    session_factory   builds the ChatEngine; called once, in a thread worker, at mount
    initial_strategy  applied to the session once it is loaded (None: keep the session's own)
    max_new_tokens    per reply
    """

    CSS_PATH = "app.tcss"
    TITLE = "specchat"
    BINDINGS = [
        Binding("ctrl+s,f2", "cycle_strategy", "Strategy", id="cycle_strategy", priority=True),
        Binding("f1", "help", "Help", id="help"),
        Binding("ctrl+q", "quit", "Quit", id="quit", priority=True),
    ]

    def __init__(
        self,
        session_factory: SessionFactory,
        initial_strategy: Strategy | None = None,
        max_new_tokens: int = 512,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.session_factory = session_factory
        self.initial_strategy = initial_strategy
        self.max_new_tokens = max_new_tokens
        self.session: ChatEngine | None = None
        self.load_error: str | None = None
        self.chat = ChatScreen(max_new_tokens=max_new_tokens, id="chat")

    def get_default_screen(self) -> ChatScreen:
        return self.chat

    def on_mount(self) -> None:
        self._load_session()

    # ---- loading ---------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load_session(self) -> None:
        """Worker thread: build the session (this is where torch gets imported)."""
        try:
            session = self.session_factory()
        except Exception as exc:  # noqa: BLE001 - any load failure becomes a toast
            self.post_message(SessionFailed(error_line(exc)))
        else:
            self.post_message(SessionLoaded(session))

    def on_session_loaded(self, message: SessionLoaded) -> None:
        session = message.session
        if self.initial_strategy is not None:
            try:
                session.strategy = self.initial_strategy.validate(has_drafter_model=session.has_drafter)
            except ValueError as exc:  # StrategyError, or a bad tree shape
                self.notify(f"{exc}; using {session.strategy.label()}", severity="warning", timeout=8)
        self.session, self.load_error = session, None
        self.chat.attach_session(session)

    def on_session_failed(self, message: SessionFailed) -> None:
        self.session, self.load_error = None, message.error
        self.chat.attach_session(None, message.error)
        self.notify(message.error, title="Could not load the model", severity="error", timeout=10)

    # ---- actions ---------------------------------------------------------------------------------
    def action_cycle_strategy(self) -> None:
        """Switch to the next usable preset; the loop picks it up at its next step."""
        session = self.session
        if session is None:
            self.notify("No model loaded yet: nothing to switch.", severity="warning")
            return
        result = next_preset(session.strategy, session.has_drafter)
        if result.strategy is None:
            self.notify("No other strategy is usable here.\n" + "\n".join(result.skipped), severity="warning")
            return
        session.strategy = result.strategy
        self.chat.show_strategy()
        if result.skipped:
            self.notify("\n".join(result.skipped), severity="warning", timeout=6)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())


def run_app(session_factory: SessionFactory, **kwargs: Any) -> None:
    """Run the TUI until the user quits (the CLI's entry point). ``kwargs`` go to SpecChatApp."""
    SpecChatApp(session_factory, **kwargs).run()
