"""ChatSession: the one object the UI and the CLI drive. Everything model-related is loaded here.

Contract used by the UI (app/ never imports torch; it imports this module inside a worker thread):

    session = ChatSession.load(target="smollm2-135m-instruct", drafter=None, strategy="sd")
    session.strategy = session.strategy.replace(name="tree")      # any time; read once per step
    for ev in session.stream_chat(messages, max_new_tokens=256, stop=threading.Event()):
        ...                                                         # engine.events.StepEvent

``messages`` is a list of {"role": "system"|"user"|"assistant", "content": str}; the model's chat
template renders them. ``stop.set()`` ends the reply after the current step (finish_reason
"stopped"); the partial reply stays valid.
"""

from __future__ import annotations

import threading
from typing import Iterator, Protocol

from .events import StepEvent
from .strategy import Strategy


class ChatEngine(Protocol):
    """What the UI needs from a session (a fake implements it in tests)."""

    strategy: Strategy
    description: str  # e.g. "SmolLM2-135M-Instruct (GGUF Q4_1) <- drafter: ..."
    context_length: int
    has_drafter: bool

    def stream_chat(
        self, messages: list[dict[str, str]], max_new_tokens: int, stop: threading.Event
    ) -> Iterator[StepEvent]: ...
