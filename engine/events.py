"""StepEvent: what one decode step did. The UI, the CLI's --json and the benchmark all read these.

Kept free of torch so the UI can import it without pulling the engine in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FINISH_REASONS = ("eos", "length", "stopped", "context", "error", "stop_string")


@dataclass
class StepEvent:
    """One target forward (one speculative step, or one plain decoding step).

    drafted       draft nodes the target verified this step (tree size; 0 for ar)
    accepted      drafted tokens the target accepted (length of the accepted path)
    emitted       token ids the step output: the accepted path plus the target's own token
    text          the text those tokens add (UTF-8 safe: bytes of a split character wait for the next step)
    segments      ``text`` split into the drafted-and-accepted part and the target's own token
    tree_tokens / tree_parents   the draft tree (packed, parents -1 = root) for the tree view
    accepted_nodes               indices into the tree of the accepted path
    """

    step: int
    strategy: str
    drafted: int
    accepted: int
    emitted: list[int]
    text: str
    tree_tokens: list[int] = field(default_factory=list)
    tree_parents: list[int] = field(default_factory=list)
    accepted_nodes: list[int] = field(default_factory=list)
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    ms: float = 0.0
    position: int = 0  # tokens in the context after this step
    finished: bool = False
    finish_reason: str | None = None
    rss_mb: float = 0.0
    segments: list[tuple[str, str]] = field(default_factory=list)  # (text, "accepted" | "target")
    tree_text: list[str] = field(default_factory=list)  # readable token per tree node
    gpu_mb: tuple[float, float] | None = None  # torch CUDA allocator (allocated, peak) MB; None without CUDA
    shape: list[int] = field(default_factory=list)  # the tree shape drafted (widths per depth)
    accepted_ranks: list[int] = field(default_factory=list)  # rank among its siblings of each accepted node
    policy: dict[str, Any] | None = None  # mab / optimal telemetry: arms, counts, means, lambdas, ranks
    bridge: dict[str, Any] | None = None  # vocabulary bridge of a drafter with another vocabulary: name, drafter tokens, proposals
    extra: dict[str, Any] = field(default_factory=dict)
    prefill_s: float = 0.0  # first event of a chat reply: seconds of the prompt's prefill before it
    prefill_tokens: int = 0  # and the prompt tokens prefilled (a multi-turn chat reuses the cached prefix)
    dropped_messages: int = 0  # and the conversation's oldest messages left out to fit the context

    def to_json(self) -> dict[str, Any]:
        """The per-step record of `generate --json` (CLI contract)."""
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "emitted": len(self.emitted),
            "tree_size": self.drafted,
            "ms": round(self.ms, 3),
        }


@dataclass
class GenerationSummary:
    """Totals over a reply, from its StepEvents (excludes model loading and prompt prefill)."""

    steps: int = 0
    new_tokens: int = 0
    decode_s: float = 0.0
    prefill_s: float = 0.0
    drafted: int = 0
    accepted: int = 0
    finish_reason: str | None = None

    def add(self, ev: StepEvent) -> None:
        if ev.prefill_s:
            self.prefill_s = ev.prefill_s
        if ev.finished:
            self.finish_reason = ev.finish_reason
        if not ev.emitted:  # a bookkeeping event (stopped / context full): no target forward
            return
        self.steps += 1
        self.new_tokens += len(ev.emitted)
        self.decode_s += ev.ms / 1000.0
        self.drafted += ev.drafted
        self.accepted += ev.accepted

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean tokens emitted per target forward (the papers' acceptance length; 1.0 for ar)."""
        return self.new_tokens / self.steps if self.steps else 0.0
