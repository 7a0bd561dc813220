"""SpecChatApp: the Textual app. It loads the engine session in a thread and hosts the screens.

    from app.main import run_app
    run_app(lambda: ChatSession.load(target="smollm2-135m-instruct"), max_new_tokens=256)

The factory is called inside a worker thread, so the app itself never imports torch; it only
knows the torch-free contracts in engine.events, engine.strategy and engine.session.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App
from textual.binding import Binding

from engine.errors import ConfigError
from engine.registry import load_registry
from engine.session import ChatEngine, load_warnings, strategy_label
from engine.strategy import ADAPTIVE, Strategy

from . import key_order
from .commands import StrategyCommands
from .keys import keymap_path, load_keymap, with_keys
from .messages import BaselineMeasured, SessionFailed, SessionLoaded, error_line
from .screens import ChatScreen, HelpScreen, ModelChoice, ModelsScreen
from .screens.models import NO_DRAFTER
from .store import open_store
from .strategy_cycle import next_preset

key_order.install()  # bound keys (Backspace...) in typing order under load: Textual #6605

SessionFactory = Callable[[], ChatEngine]
# (target ref, drafter ref, "none", or None: the target's default pairing's, as at start-up) -> session; runs in a thread
ModelLoader = Callable[[str, str | None], ChatEngine]


def load_chat_session(target: str, drafter: str | None, models_file: str | None = None) -> ChatEngine:
    """The default :data:`ModelLoader` (Ctrl+O): a ChatSession; torch loads here, in the worker."""
    from engine.session import ChatSession

    return ChatSession.load(target=target, drafter=drafter, models_file=models_file)


TERMINAL_CHECK_S = 1.0  # how often the app checks that its terminal is still there

# Python's GIL switch interval while the app runs (the interpreter's default is 5 ms). The engine
# thread gives up the GIL in every C kernel call and must take it back after each; while the UI
# thread runs a frame (tens of ms of pure Python: layout, render), each take-back waited up to the
# whole interval. `bench/app_stream.py --strategy ar --gil-switch-ms 5|0.5`, 5 alternated pairs on a
# 2-core AVX2 EPYC: app / no-UI rate, median 0.706 -> 0.765, 0.5 ms ahead in 4 of 5
# (bench/results/2026-11-26-session19/). 0.5 -> 0.1 ms (session 30, 2-core Zen 4, `pld:auto`,
# six alternated pairs): mean app / no-UI 0.755 -> 0.801, 0.1 ms ahead in 5 of 6; a Python thread
# busy 30% of the time cost `stream_chat` 25-32% of its rate at 0.5 ms, 12-15% at 0.1
# (bench/results/2026-11-28-session30/).
GIL_SWITCH_S = 0.0001


def freeze_heap() -> None:
    """Move every object alive now (the loaded engine: ~200k objects for SmolLM2 with its tokenizer)
    out of the garbage collector's reach, once a session is loaded (and again after a switch:
    unfreeze first, so the previous session's objects can still be collected).

    Textual allocates enough while a reply streams to set off a full collection every few seconds;
    each one walked the whole engine with the GIL held: 155-218 ms a collection, 57-60 ms frozen
    (`bench/app_stream.py --strategy ar --prompts 6`, 2-core AVX2 EPYC; results in
    bench/results/2026-11-26-app-frames/). Frozen objects are still freed by reference counting;
    those in reference cycles wait for the next switch's unfreeze.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def terminal_fd() -> int | None:
    """The app's terminal: stdin or stdout if either is one (None when headless)."""
    import os
    import sys

    for f in (sys.__stdin__, sys.__stdout__):
        try:
            fd = f.fileno()
        except (AttributeError, ValueError, OSError):
            continue
        if os.isatty(fd):
            return fd
    return None


def terminal_alive(fd: int) -> bool:
    """Whether ``fd`` is still a terminal: a hung-up one is not (isatty false, reads EIO/EOF)."""
    import os

    return os.isatty(fd)


def screenshot_dir() -> Path:
    """Where the palette's Screenshot saves: the Downloads folder where there is one, else the
    current directory."""
    from platformdirs import user_downloads_path

    downloads = user_downloads_path()
    return downloads if downloads.is_dir() else Path.cwd()


class SpecChatApp(App[None]):
    """A chat with a speculative-decoding engine.

    session_factory   builds the ChatEngine; called once, in a thread worker, at mount
    initial_strategy  applied to the session once it is loaded (None: keep the session's own)
    initial_sampling  Strategy fields (temperature, top_p, top_k, min_p, repeat_penalty,
                      repeat_last_n, seed: the chat command's sampling flags) set on the first
                      model's strategy, whichever it is (``initial_strategy``, the saved one, the default)
    max_new_tokens    per reply
    model_loader      builds the session for a model picked with Ctrl+O (default: ChatSession.load)
    models_file       the models.toml the picker lists (default: $SPECCHAT_MODELS or the shipped one)
    system_prompt     new chats' system prompt this run (None: the one saved in the settings, if any)
    keymap_file       the user's keys (default: $SPECCHAT_KEYMAP or keymap.toml in the data dir; app/keys.py)
    """

    CSS_PATH = "app.tcss"
    TITLE = "specchat"
    COMMANDS = App.COMMANDS | {StrategyCommands}
    BINDINGS = [
        Binding("ctrl+s,f2", "cycle_strategy", "Strategy", id="cycle_strategy", priority=True),
        Binding("ctrl+o", "models", "Models", id="models", priority=True),
        Binding("f1", "help", "Help", id="help"),
        Binding("ctrl+q", "quit", "Quit", id="quit", priority=True),
    ]

    def __init__(
        self,
        session_factory: SessionFactory,
        initial_strategy: Strategy | None = None,
        max_new_tokens: int = 512,
        initial_sampling: dict[str, Any] | None = None,
        model_loader: ModelLoader | None = None,
        models_file: str | None = None,
        system_prompt: str | None = None,
        keymap_file: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # the user's keys (app/keys.py): applied before anything is shown, problems noticed at mount
        self.keymap_path = keymap_path(keymap_file)
        self.keymap, self.keymap_problems = load_keymap(self.keymap_path)
        self.set_keymap(self.keymap)
        self.session_factory = session_factory
        self.models_file = models_file
        self.model_loader: ModelLoader = model_loader or (
            lambda target, drafter: load_chat_session(target, drafter, models_file))
        self.switching_to: ModelChoice | None = None  # the last Ctrl+O pick, until its load ends
        self._loads = 0  # loads started (at start-up, then one a pick): only the last one's result is used
        self._switch_after_reply: ModelChoice | None = None  # picked while a reply ran: loaded when it ends
        self.interrupted_by: str | None = None  # the signal that quit the app (_take_signals)
        self._signals: list[int] = []
        self.cycle_auto = True  # Ctrl+S: cost-aware draft lengths for the chain presets (the default's)
        self.initial_strategy = initial_strategy
        self.max_new_tokens = max_new_tokens
        self.session: ChatEngine | None = None
        self.load_error: str | None = None
        # chats and settings (app.store): the file in the data dir, or in memory if it cannot be used
        self.store, store_error = open_store()
        self.chat = ChatScreen(max_new_tokens=max_new_tokens, store=self.store, store_error=store_error,
                               restore_strategy=initial_strategy is None, system_prompt=system_prompt,
                               sampling=initial_sampling, id="chat")

    def get_default_screen(self) -> ChatScreen:
        return self.chat

    def on_mount(self) -> None:
        self._gil_switch_was = sys.getswitchinterval()
        sys.setswitchinterval(GIL_SWITCH_S)
        if self.keymap_problems:
            more = len(self.keymap_problems) - 3
            self.notify("\n".join(self.keymap_problems[:3]) + (f"\n(and {more} more)" if more > 0 else ""),
                        title="Keymap", severity="warning", timeout=12, markup=False)  # the user's text
        self._start_load(self.session_factory)
        self._tty_fd = terminal_fd()
        if self._tty_fd is not None:
            self.set_interval(TERMINAL_CHECK_S, self._check_terminal)
        self._take_signals()

    def on_unmount(self) -> None:
        sys.setswitchinterval(self._gil_switch_was)
        self._give_back_signals()

    # ---- signals -----------------------------------------------------------------------------------
    def _take_signals(self) -> None:
        """SIGINT (``kill -INT``, or Ctrl-C reaching the process from outside the raw terminal) and
        SIGTERM quit as Ctrl+Q does (a reply in flight stopped and saved, the store closed), then
        the CLI says so and exits 130 / 143; before, SIGINT left silently with status 0 and SIGTERM
        killed the process mid-write. A second one while quitting takes the default action."""
        try:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal, sig)
                self._signals.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (a test's app), no such API
            pass

    def _give_back_signals(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        for sig in self._signals:
            try:
                loop.remove_signal_handler(sig)  # (SIGINT back to Python's KeyboardInterrupt)
            except (RuntimeError, ValueError):
                pass
        self._signals = []

    def _on_signal(self, sig: int) -> None:
        if self.interrupted_by is not None:  # a second one: quitting is stuck, or the user insists
            self._give_back_signals()
            os.kill(os.getpid(), sig)
            return
        self.interrupted_by = signal.Signals(sig).name
        self.exit(return_code=128 + int(sig))

    def _check_terminal(self) -> None:
        """The terminal went away (its window closed, an ssh link dropped) without a SIGHUP
        reaching the app, as under `make chat`, where make, the terminal's session leader, takes
        it and waits for the app: quit as Ctrl+Q does (a reply in flight is stopped, finished
        chats are already saved) instead of running on unseen. Measured before: such an orphan
        spun at ~70% of a core."""
        if self._tty_fd is not None and not terminal_alive(self._tty_fd):
            self._tty_fd = None
            self.exit()

    # ---- loading ---------------------------------------------------------------------------------
    def _start_load(self, factory: SessionFactory, choice: ModelChoice | None = None) -> None:
        """Build a session in the load worker. Loads overlap (a pick during the start-up load, which
        takes seconds for the real model, or during another pick's) and end in any order: the last
        one started wins, and the others' results are dropped when they come (their sessions freed
        with the message, their errors unsaid). Sends wait for the last load (no session yet, or
        ``switching_to`` set from the pick until its own load ends), so no reply is running when a
        session is attached."""
        self._loads += 1
        self.switching_to = choice
        if choice is not None:  # sends wait for it: the status line says so (it said "ready" beside the old model)
            self.chat.show_loading(choice.target)
        self._load_session(factory, self._loads)

    @work(thread=True, group="load", exit_on_error=False)
    def _load_session(self, factory: SessionFactory, load: int) -> None:
        """Worker thread: build the session (this is where torch gets imported)."""
        try:
            session = factory()
        except Exception as exc:  # noqa: BLE001 - any load failure becomes a toast
            self.post_message(SessionFailed(error_line(exc), load))
        else:
            self.post_message(SessionLoaded(session, load))

    def on_session_loaded(self, message: SessionLoaded) -> None:
        if message.load != self._loads:
            return  # superseded: a later pick, or the model in use kept (switch_model)
        session = message.session
        if self.initial_strategy is not None:
            try:
                session.strategy = self.initial_strategy.validate(has_drafter_model=session.has_drafter)
            except ValueError as exc:  # StrategyError, or a bad tree shape
                self.notify(f"{exc}; using {strategy_label(session)}", severity="warning", timeout=8, markup=False)
        for line in load_warnings(session):
            self.notify(line, title="Loaded with less", severity="warning", timeout=12, markup=False)
        self.session, self.load_error = session, None
        picked, self.switching_to = self.switching_to, None
        if picked is not None:  # (sends were refused until now, "send when it is ready": it is)
            self.notify(f"{session.description} is ready.", timeout=5, markup=False)
        self.chat.attach_session(session)
        freeze_heap()
        self.measure_baseline()

    # ---- the plain-decoding baseline of the dashboard's speedup ---------------------------------------
    def measure_baseline(self, when: str = "at load") -> bool:
        """Measure plain decoding of the loaded target in a thread (its own cache: the chat is
        untouched); the dashboard shows the speedup against it, labelled as measured (``when``:
        "at load", or "on request" from the palette). False: no model to measure (none loaded yet,
        or a session that cannot measure one)."""
        self._baseline_when = when
        session = self.session
        if session is None or not hasattr(session, "measure_baseline"):
            return False
        self.chat.dashboard.set_baseline(None, "measuring plain decoding…")
        self._measure_baseline(session, self.chat.busy, session.strategy)
        return True

    @work(thread=True, exclusive=True, group="baseline", exit_on_error=False)
    def _measure_baseline(self, session: ChatEngine, busy_at_start: bool, strategy: Strategy) -> None:
        try:
            b = session.measure_baseline(strategy=strategy)  # type: ignore[attr-defined] - plain decoding sampling as it does
        except Exception as exc:  # noqa: BLE001 - the dashboard just says it could not measure
            self.post_message(BaselineMeasured(session, None, error_line(exc)))
        else:
            self.post_message(BaselineMeasured(session, b, None, busy_at_start))

    def on_baseline_measured(self, message: BaselineMeasured) -> None:
        from .widgets.dashboard import BaselineInfo

        if message.session is not self.session:
            return  # measured for a model since replaced
        if message.baseline is None:
            self.notify(f"Could not measure the plain-decoding baseline: {message.error}", severity="warning", timeout=6,
                        markup=False)
            self.chat.dashboard.set_baseline(None, "plain-decoding baseline could not be measured: Ctrl+P, Measure, to retry")
            return
        b = message.baseline
        note = f"ar measured {getattr(self, '_baseline_when', 'at load')}, {b.tokens} tokens" + (" while a reply ran" if message.overlapped or self.chat.busy else "")
        self.chat.dashboard.set_baseline(BaselineInfo(b.tokens_per_s, note, fit=b, sampling=getattr(b, "sampling", "T=0")))

    def on_session_failed(self, message: SessionFailed) -> None:
        if message.load != self._loads:
            return  # superseded: the user has moved on from that pick
        choice, self.switching_to = self.switching_to, None
        title = f"Could not load {choice.target}" if choice is not None else "Could not load the model"
        if choice is not None and self.session is not None:  # a switch failed: keep chatting with the old model
            self.chat.show_loading(None)
            self.notify(f"{message.error}; still using {self.session.description}",
                        title=title, severity="error", timeout=10, markup=False)
            return
        self.session, self.load_error = None, message.error
        self.chat.attach_session(None, message.error)
        self.notify(message.error, title=title, severity="error", timeout=10, markup=False)

    # ---- actions ---------------------------------------------------------------------------------
    def deliver_screenshot(self, filename: str | None = None, path: str | None = None,
                           time_format: str | None = None) -> str | None:
        """The palette's Screenshot: Textual saves into the user's Downloads folder, and failed
        ("Failed to save screenshot") where there is none, as on most servers and containers a
        terminal app runs on; then it goes to the current directory (the notice names the file)."""
        if path is None:
            path = str(screenshot_dir())
        return super().deliver_screenshot(filename, path, time_format)

    def action_cycle_strategy(self) -> None:
        """Switch to the next usable preset; the loop picks it up at its next step."""
        session = self.session
        if session is None:
            self.notify("No model loaded yet: nothing to switch.", severity="warning")
            return
        current = session.strategy
        if current.name in ADAPTIVE:  # a chain preset says whether the cycle runs cost-aware lengths
            self.cycle_auto = current.adaptive
        result = next_preset(current, session.has_drafter, auto=self.cycle_auto)
        if result.strategy is None:
            self.notify("No other strategy is usable here.\n" + result.notice(self._models_key()), severity="warning",
                        markup=False)
            return
        session.strategy = result.strategy
        self.chat.show_strategy()
        if result.skipped:
            self.notify(result.notice(self._models_key()), severity="warning", timeout=6, markup=False)

    def _models_key(self) -> str:
        """The model picker's key in the user's keymap (Ctrl+O by default), for advice in notices."""
        return with_keys("{models}", self.keymap)

    def _loaded_names(self) -> tuple[str | None, str | None]:
        """The registry names of the session's target and drafter (None where there is none)."""
        target = getattr(getattr(self.session, "target", None), "name", None)
        drafter = getattr(getattr(self.session, "drafter", None), "name", None)
        return target, drafter

    def action_models(self) -> None:
        """Ctrl+O: the model picker; what it returns is loaded by :meth:`switch_model`."""
        if isinstance(self.screen, ModelsScreen):
            return
        if any(isinstance(s, ModelsScreen) for s in self.screen_stack):  # under the command palette, say
            # (a second picker over a downloading one started a second download of the same files)
            self.notify("The model picker is already open: close this to get back to it.", timeout=4)
            return
        try:
            registry = load_registry(self.models_file)
        except ConfigError as exc:
            self.notify(str(exc), title="models.toml", severity="error", timeout=10, markup=False)
            return
        loading = self.switching_to.target if self.switching_to is not None else None
        self.push_screen(ModelsScreen(registry, *self._loaded_names(), loading=loading), self.switch_model)

    def switch_model(self, choice: ModelChoice | None) -> None:
        """Load ``choice`` in the load worker; the current session stays until the new one is ready.
        A pick while another loads replaces it (the last pick wins); picking the model in use then
        keeps it."""
        if choice is None:
            return
        if self.chat.busy:  # loaded once the reply ends (it was refused: the picker closed, to be opened again)
            self._switch_after_reply = choice
            self.notify(with_keys(f"{choice.target} loads once this reply ends ({{stop}} stops it now).", self.keymap),
                        timeout=6, markup=False)
            return
        if choice == self.switching_to:
            self.notify(f"{choice.target} is already loading.", timeout=4, markup=False)
            return
        target, drafter = self._loaded_names()
        if self.switching_to is not None and self.session is not None and (choice.target, choice.drafter) == (
                target, drafter or NO_DRAFTER):
            self.notify(f"Keeping {self.session.description}: the load of {self.switching_to.target} is dropped.",
                        timeout=6, markup=False)
            self._loads += 1  # the load in flight is superseded: its result is dropped when it comes
            self.switching_to = None
            self.chat.show_loading(None)
            return
        loader = self.model_loader
        self._start_load(lambda: loader(choice.target, choice.drafter_ref), choice)
        with_drafter = "" if choice.drafter == NO_DRAFTER else f" with drafter {choice.drafter}"
        self.notify(f"Loading {choice.target}{with_drafter}…", timeout=4, markup=False)

    def reply_ended(self) -> None:
        """The chat screen's reply is over: the model picked while it ran loads now."""
        choice, self._switch_after_reply = self._switch_after_reply, None
        if choice is not None:
            self.switch_model(choice)

    def action_measure_baseline(self) -> None:
        self.measure_baseline("on request")

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())


def run_app(session_factory: SessionFactory, **kwargs: Any) -> str | None:
    """Run the TUI until the user quits (the CLI's entry point). ``kwargs`` go to SpecChatApp.
    Returns the name of the signal that ended it (SIGINT, SIGTERM), None when the user quit."""
    app = SpecChatApp(session_factory, **kwargs)
    app.run()
    return getattr(app, "interrupted_by", None)
