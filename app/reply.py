"""One assistant reply in flight: the hand-off between the engine thread and the UI thread.

The engine thread runs :meth:`ReplyRun.pump`, which puts every StepEvent (or the exception that
ended the loop) on a queue and never touches a widget. The UI drains the queue on a timer with
:meth:`ReplyRun.drain`, which folds the events into running totals and returns the text they
added, so the chat writes one Markdown fragment per drain however many steps arrived.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from queue import Empty, SimpleQueue

from engine.errors import ContextOverflowError
from engine.events import GenerationSummary, StepEvent
from engine.session import ChatEngine

from .messages import error_line

_DONE = object()  # the pump's last item: the engine loop has returned (or raised)


def add_change(labels: list[str], label: str | None) -> None:
    """Append ``label`` to ``labels`` unless it is empty or the last one (each change, in order)."""
    if label and (not labels or labels[-1] != label):
        labels.append(label)


class ReplyRun:
    """The state of one reply: stop flag, queue, and what the UI has drained so far.

    Only ``stop`` and the queue cross threads; every other attribute belongs to the UI thread.
    """

    def __init__(self, messages: list[dict[str, str]], max_new_tokens: int) -> None:
        self.messages = [dict(m) for m in messages]  # a snapshot: the engine sees this turn only
        self.max_new_tokens = max_new_tokens
        self.stop = threading.Event()
        self.summary = GenerationSummary()
        self.text = ""
        self.last_event: StepEvent | None = None
        self.new_events: list[StepEvent] = []  # the events the last drain took (for the dashboard)
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.finished = False
        self.only_ar = True  # every step so far was plain decoding (the dashboard's in-app baseline)
        self.strategies: list[str] = []  # the steps' strategy labels, each change in order (live switches)
        self.dropped_messages = 0  # the oldest messages the engine left out to fit the context (first event)
        self._queue: SimpleQueue[object] = SimpleQueue()

    # ---- engine thread ---------------------------------------------------------------------------
    def pump(self, session: ChatEngine, is_cancelled: Callable[[], bool] = lambda: False) -> None:
        """Run the engine's loop to the end, queueing its events. Never raises."""
        try:
            for ev in session.stream_chat(self.messages, self.max_new_tokens, self.stop):
                self._queue.put(ev)
                if is_cancelled():
                    self.stop.set()  # the worker was cancelled (app closing): end after this step
        except Exception as exc:  # noqa: BLE001 - shown to the user, the app keeps running
            self._queue.put(exc)
        finally:
            self._queue.put(_DONE)

    # ---- UI thread -------------------------------------------------------------------------------
    def drain(self) -> str:
        """Take everything queued so far; return the text it adds (possibly empty)."""
        parts: list[str] = []
        self.new_events = []
        while not self.finished:
            try:
                item = self._queue.get_nowait()
            except Empty:
                break
            if item is _DONE:
                self.finished = True
            elif isinstance(item, ContextOverflowError):  # the message alone does not fit: not a failure
                self.finish_reason = "context"
            elif isinstance(item, BaseException):
                self.error = error_line(item)
                self.finish_reason = "error"
            elif isinstance(item, StepEvent):
                self.summary.add(item)
                self.dropped_messages = max(self.dropped_messages, item.dropped_messages)
                self.only_ar = self.only_ar and item.strategy.split(" ", 1)[0] == "ar"
                add_change(self.strategies, item.strategy)
                if item.emitted or self.last_event is None:
                    # the engine's bookkeeping event (Esc, a full context: nothing emitted, drafted 0,
                    # numbered as the step before it) is no step: the last real one stays the one shown
                    self.last_event = item
                self.new_events.append(item)
                parts.append(item.text)
                if item.finished and item.finish_reason:
                    self.finish_reason = item.finish_reason
        if self.finished and self.finish_reason is None and self.stop.is_set():
            self.finish_reason = "stopped"
        new_text = "".join(parts)
        self.text += new_text
        if self.finished and self.finish_reason != "eos" and self.text.endswith("\ufffd"):
            # a reply cut inside a character (the token limit, Esc): the detokeniser's last flush
            # wrote the unfinished character as U+FFFD; the reply is saved and shown without it
            # (Continue writes that character whole)
            self.text = self.text.rstrip("\ufffd")
        return new_text

    @property
    def stopped(self) -> bool:
        return self.finish_reason == "stopped"
