"""Fake ChatEngines for the UI tests: scripted StepEvents, no torch, no model."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator, Sequence

from engine.events import StepEvent
from engine.strategy import Strategy, preset

SAFETY_TIMEOUT_S = 10.0  # a blocked fake never outlives a broken test by more than this


class FakeEngine:
    """Yields one StepEvent per chunk of ``script``; the last one finishes with ``finish_reason``.

    Reads ``self.strategy`` once per step like the real loop and records what it saw in
    ``seen_strategies``; records every ``messages`` argument in ``calls``.
    If ``gate`` is given, each step first waits for one ``gate.release()`` (tests drive the pace).
    """

    def __init__(
        self,
        script: Sequence[str] = ("Hello", " there", ", friend."),
        *,
        strategy: Strategy | None = None,
        has_drafter: bool = True,
        finish_reason: str = "eos",
        step_delay_s: float = 0.002,
        gate: threading.Semaphore | None = None,
        description: str = "FakeLM-1M (test) <- drafter: FakeDraft-100k",
    ) -> None:
        self.script = list(script)
        self.strategy = strategy or preset("sd")
        self.has_drafter = has_drafter
        self.description = description
        self.context_length = 2048
        self.finish_reason = finish_reason
        self.step_delay_s = step_delay_s
        self.gate = gate
        self.calls: list[list[dict[str, str]]] = []
        self.seen_strategies: list[str] = []
        self.steps_done = 0
        self.threads: list[str] = []  # the thread each stream_chat call ran on
        self.dropped_messages = 0  # the first event of each reply says this many messages were left out

    def _event(self, i: int, text: str, strategy: Strategy, finished: bool, reason: str | None) -> StepEvent:
        drafted = 0 if strategy.name == "ar" else 5
        accepted = 0 if strategy.name == "ar" else 3
        return StepEvent(
            step=i, strategy=strategy.label(), drafted=drafted, accepted=accepted,
            emitted=list(range(accepted + 1)), text=text, ms=2.0, position=10 + i,
            finished=finished, finish_reason=reason,
        )

    def stream_chat(
        self, messages: list[dict[str, str]], max_new_tokens: int, stop: threading.Event
    ) -> Iterator[StepEvent]:
        self.calls.append(copy.deepcopy(messages))
        self.threads.append(threading.current_thread().name)
        for i, chunk in enumerate(self.script, start=1):
            if self.gate is not None and not self.gate.acquire(timeout=SAFETY_TIMEOUT_S):
                raise TimeoutError("test gate never released")
            strategy = self.strategy  # read once per step
            self.seen_strategies.append(strategy.name)
            time.sleep(self.step_delay_s)
            last = i == len(self.script)
            stopped = stop.is_set() and not last
            ev = self._event(i, chunk, strategy, last or stopped,
                             self.finish_reason if last else "stopped" if stopped else None)
            if i == 1:
                ev.dropped_messages = self.dropped_messages
            yield ev
            self.steps_done = i
            if stopped:
                return


class BlockingEngine(FakeEngine):
    """Yields ``script`` and then blocks until ``stop`` is set, then finishes with "stopped"."""

    def __init__(self, script: Sequence[str] = ("Partial", " answer"), **kwargs: object) -> None:
        super().__init__(script, **kwargs)  # type: ignore[arg-type]
        self.blocking = threading.Event()
        self.released = threading.Event()  # stop was seen: the engine thread is ending

    def stream_chat(
        self, messages: list[dict[str, str]], max_new_tokens: int, stop: threading.Event
    ) -> Iterator[StepEvent]:
        self.calls.append(copy.deepcopy(messages))
        for i, chunk in enumerate(self.script, start=1):
            self.seen_strategies.append(self.strategy.name)
            yield self._event(i, chunk, self.strategy, False, None)
        self.blocking.set()
        if stop.wait(SAFETY_TIMEOUT_S):
            self.released.set()
        yield self._event(len(self.script) + 1, "", self.strategy, True, "stopped")


class FailingEngine(FakeEngine):
    """Yields one step, then its loop raises (a multi-line message: only the first line shows)."""

    def stream_chat(
        self, messages: list[dict[str, str]], max_new_tokens: int, stop: threading.Event
    ) -> Iterator[StepEvent]:
        self.calls.append(copy.deepcopy(messages))
        yield self._event(1, "Half a", self.strategy, False, None)
        raise RuntimeError("device out of memory\n(details the user does not need)")


def tree_step(
    step: int,
    words: Sequence[str],
    parents: Sequence[int],
    accepted_nodes: Sequence[int],
    target: str,
    *,
    ms: float = 10.0,
    strategy: str = "tree greedy",
) -> StepEvent:
    """A speculative step with a draft tree: ``words`` per node, the accepted path, the target's token."""
    accepted_text = [words[i] for i in accepted_nodes]
    segments = [(t, "accepted") for t in accepted_text] + [(target, "target")]
    return StepEvent(
        step=step, strategy=strategy, drafted=len(words), accepted=len(accepted_nodes),
        emitted=list(range(len(accepted_nodes) + 1)), text="".join(accepted_text) + target,
        tree_tokens=list(range(100 + step * 10, 100 + step * 10 + len(words))), tree_parents=list(parents),
        accepted_nodes=list(accepted_nodes), tree_text=list(words), segments=segments, ms=ms,
    )


class ScriptedEngine(FakeEngine):
    """Yields the given StepEvents as they are (the last one marked finished with "eos")."""

    def __init__(self, events: Sequence[StepEvent], **kwargs: object) -> None:
        super().__init__([ev.text for ev in events], **kwargs)  # type: ignore[arg-type]
        self.events = list(events)

    def stream_chat(
        self, messages: list[dict[str, str]], max_new_tokens: int, stop: threading.Event
    ) -> Iterator[StepEvent]:
        self.calls.append(copy.deepcopy(messages))
        for i, ev in enumerate(self.events, start=1):
            if self.gate is not None and not self.gate.acquire(timeout=SAFETY_TIMEOUT_S):
                raise TimeoutError("test gate never released")
            time.sleep(self.step_delay_s)
            if i == len(self.events):
                ev = copy.copy(ev)
                ev.finished, ev.finish_reason = True, "eos"
            yield ev
            self.steps_done = i
