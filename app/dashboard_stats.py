"""The dashboard's numbers for one reply, folded from its StepEvents (pure Python, no widgets).

Definitions (see ../shared/reference/ux.md §2.4):
    tokens per step   tokens emitted per target forward (accepted path + the target's own token);
                      its mean over the reply is the papers' acceptance length (1.0 for plain decoding)
    tok/s now         tokens / decode time over the last ``NOW_WINDOW`` steps
    tok/s avg         tokens / decode time over the whole reply (prefill and loading excluded)
    acceptance by depth   fraction of speculative steps whose accepted path reached depth >= d
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.events import GenerationSummary, StepEvent

NOW_WINDOW = 10  # steps behind "tok/s now"
MAX_HISTORY = 2000  # steps of one reply kept for the sparkline and the tree view


def tree_depth(parents: list[int]) -> int:
    """Depth of a packed draft tree (parents[i] = -1 for children of the root; a chain of k: k)."""
    depth: list[int] = []
    for i, parent in enumerate(parents):
        depth.append(1 if parent < 0 or parent >= i else depth[parent] + 1)
    return max(depth, default=0)


def draft_depth(ev: StepEvent) -> int:
    """How deep this step's draft went: the tree's depth, or ``drafted`` for a chain without tree data."""
    return tree_depth(ev.tree_parents) if ev.tree_parents else ev.drafted


def accepted_depth(ev: StepEvent) -> int:
    """Depth the accepted path reached (``accepted`` is the length of that path)."""
    return len(ev.accepted_nodes) if ev.accepted_nodes else ev.accepted


@dataclass
class DashboardStats:
    """Running totals of the reply in flight. Owned by the UI thread; call :meth:`add` per event."""

    summary: GenerationSummary = field(default_factory=GenerationSummary)
    per_step: deque[int] = field(default_factory=lambda: deque(maxlen=MAX_HISTORY))  # tokens emitted
    events: deque[StepEvent] = field(default_factory=lambda: deque(maxlen=MAX_HISTORY))
    last: StepEvent | None = None
    spec_steps: int = 0  # steps that verified a draft (drafted > 0)
    reached: list[int] = field(default_factory=list)  # reached[d-1]: spec steps with accepted depth >= d
    max_depth: int = 0
    _recent: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=NOW_WINDOW))
    _context_sum: float = 0.0  # sum over emitted tokens of the context each was decoded at
    _tokens: int = 0
    prefill_tokens: int = 0  # the prompt tokens this reply prefilled (its first event says)
    dropped_messages: int = 0  # the conversation's oldest messages left out to fit the context (first event)

    def add(self, ev: StepEvent) -> None:
        self.summary.add(ev)
        if ev.prefill_s or ev.prefill_tokens:
            self.prefill_tokens = ev.prefill_tokens
        if ev.dropped_messages:
            self.dropped_messages = ev.dropped_messages
        if not ev.emitted:  # bookkeeping event (stopped, context full): no target forward
            return
        self.last = ev
        self.events.append(ev)
        self.per_step.append(len(ev.emitted))
        self._recent.append((len(ev.emitted), ev.ms))
        n = len(ev.emitted)
        if ev.position >= n:  # the step's tokens sit at positions position - n .. position - 1
            self._context_sum += n * ev.position - n * (n + 1) / 2
            self._tokens += n
        if ev.drafted > 0:
            self.spec_steps += 1
            self.max_depth = max(self.max_depth, draft_depth(ev), accepted_depth(ev))
            depth = accepted_depth(ev)
            if depth > len(self.reached):
                self.reached.extend([0] * (depth - len(self.reached)))
            for d in range(depth):
                self.reached[d] += 1

    @property
    def tokens_per_s_now(self) -> float:
        tokens = sum(n for n, _ in self._recent)
        ms = sum(m for _, m in self._recent)
        return tokens * 1000.0 / ms if ms > 0 else 0.0

    @property
    def tokens_per_s_avg(self) -> float:
        return self.summary.tokens_per_s

    @property
    def mean_context(self) -> float:
        """Tokens of context the reply's tokens were decoded at, on average (0: not known)."""
        return self._context_sum / self._tokens if self._tokens else 0.0

    @property
    def mean_tokens_per_step(self) -> float:
        return self.summary.mean_accepted

    @property
    def prefill_s(self) -> float:
        return self.summary.prefill_s

    def acceptance_by_depth(self) -> list[tuple[int, float]]:
        """[(d, fraction of speculative steps whose accepted path reached depth >= d)], d = 1..max."""
        if not self.spec_steps:
            return []
        return [(d, (self.reached[d - 1] if d <= len(self.reached) else 0) / self.spec_steps)
                for d in range(1, self.max_depth + 1)]
