"""Messages the worker threads post to the UI (``post_message`` is thread-safe)."""

from __future__ import annotations

from textual.message import Message

from engine.session import ChatEngine


def error_line(exc: BaseException) -> str:
    """The one-line, user-facing text of an exception (its first line, or its type name)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class SessionLoaded(Message):
    """The session factory of the app's load number ``load`` returned: the engine is ready to chat."""

    def __init__(self, session: ChatEngine, load: int) -> None:
        super().__init__()
        self.session = session
        self.load = load


class SessionFailed(Message):
    """The session factory of load number ``load`` raised; ``error`` is the one-line message to show."""

    def __init__(self, error: str, load: int) -> None:
        super().__init__()
        self.error = error
        self.load = load


class BaselineMeasured(Message):
    """The plain-decoding baseline of ``session`` was measured (``baseline``: engine.session.Baseline)
    or could not be (``error``)."""

    def __init__(self, session: ChatEngine, baseline: object | None, error: str | None, overlapped: bool = False) -> None:
        super().__init__()
        self.session = session
        self.baseline = baseline
        self.error = error
        self.overlapped = overlapped
