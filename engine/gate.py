"""Cost-aware draft length for the chain strategies (``sd:auto``, ``pld:auto``, ``hybrid:auto``).

A draft pays only while the tokens it is expected to add outweigh what it costs: drafting (the
drafter model's steps) and verifying more rows (the target's pass over n rows, t(n), measured on
this machine by engine/costmodel.py). Once plain decoding is fast, as it is on a CPU with the
GGUF weights kept quantised (a SmolLM2 decode step ~9 ms, a 6-row pass ~22 ms), a weak or
unlucky draft makes decoding slower, not faster. So each step the gate picks the draft length

    k* = argmax_{0 <= k <= K}  E(k) / (t(k + 1) + k·d),   E(k) = (1 - α^{k+1}) / (1 - α)

with K the strategy's draft length, d the drafter's measured milliseconds per drafted token, and
α the drafter's recent per-token acceptance (exponentially weighted counts with a Beta(1, 2)
prior: a drafter starts out trusted for a short draft, not a long one). E(k) is the expected emitted tokens of a k-chain whose tokens are each accepted with
probability α (Leviathan et al. 2023, §3.1; ALGORITHMS.md §3 uses the same cost-benefit view for
trees, STree §4). k* = 0 is a plain decoding step. A source the gate has shut off is probed with a
one-token draft after ``probe`` steps, so α can recover when the text turns repetitive; each probe
that fails doubles the wait (up to 64 steps), one that is accepted resets it.

Lossless: the length is chosen from past steps and timings only, never from the current step's
target randomness, and every verifier is exact for whatever draft it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .costmodel import VerifyCost


@dataclass
class _Source:
    accepted: float = 0.0  # weighted accepted draft tokens
    tried: float = 0.0  # weighted draft positions the verifier looked at
    ms_per_token: float = 0.0  # drafting cost, EMA
    idle: int = 0  # steps in a row the gate has drafted nothing
    wait: int = 0  # steps between probes while shut (0 = the gate's ``probe``)
    probing: bool = False  # the last draft was a probe


@dataclass
class DraftGate:
    cost: VerifyCost
    decay: float = 0.9
    probe: int = 8
    sources: dict[str, _Source] = field(default_factory=dict)
    last: dict = field(default_factory=dict)  # the last decision, for the dashboard / tests

    def alpha(self, source: str) -> float:
        s = self.sources.get(source) or _Source()
        return (s.accepted + 1.0) / (s.tried + 3.0)

    def budget(self, source: str, k_max: int) -> int:
        """The draft length to use now (0 = a plain decoding step)."""
        s = self.sources.setdefault(source, _Source())
        a = min(self.alpha(source), 0.999)
        best_k, best = 0, 1.0 / self.cost.at(1)
        for k in range(1, k_max + 1):
            expected = (1.0 - a ** (k + 1)) / (1.0 - a)
            rate = expected / (self.cost.at(k + 1) + k * s.ms_per_token)
            if rate > best:
                best_k, best = k, rate
        s.probing = False
        if best_k == 0 and k_max > 0 and s.idle + 1 >= (s.wait or self.probe):
            best_k, s.probing = 1, True
        s.idle = 0 if best_k else s.idle + 1
        self.last = {"policy": "gate", "source": source, "alpha": round(a, 3), "k": best_k, "k_max": k_max,
                     "probe": s.probing}
        return best_k

    def observe(self, source: str, depth: int, accepted: int, draft_ms: float, drafted: int) -> None:
        """One verified draft: ``depth`` its longest chain, ``accepted`` the tokens kept, and the
        ms spent drafting its ``drafted`` nodes."""
        if depth <= 0:
            return
        s = self.sources.setdefault(source, _Source())
        if s.probing:
            s.wait = self.probe if accepted else min(2 * (s.wait or self.probe), 64)
        tried = accepted + (1 if accepted < depth else 0)
        s.accepted = self.decay * s.accepted + accepted
        s.tried = self.decay * s.tried + tried
        per = draft_ms / max(drafted, 1)
        s.ms_per_token = per if s.ms_per_token == 0.0 else 0.8 * s.ms_per_token + 0.2 * per
