"""Verify-cost model (STree §4; ALGORITHMS.md §3): t(n) ≈ a + b·n + c·n² for one target pass over
n packed rows on top of the committed prefix, measured on this machine for this model and dtype.

Tree policies ([drafting]) use it to cap tree size where a bigger tree cannot pay off: adding
nodes only helps while the expected extra accepted tokens outweigh t(n + k) - t(n).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

DEFAULT_SIZES = (1, 2, 4, 8, 12, 16, 24, 32)
MEASURE_PREFIX = 128  # tokens of committed context before the measured passes (measure)


@dataclass
class VerifyCost:
    """Fitted t(n) in milliseconds, with the measured points it came from."""

    a: float
    b: float
    c: float = 0.0
    points: dict[int, float] = field(default_factory=dict)

    def __call__(self, n: int) -> float:
        return self.a + self.b * n + self.c * n * n

    def at(self, n: int) -> float:
        """t(n) from the measured points, linearly interpolated between them (small passes have
        steps the smooth fit misses: linear.c runs 1-4 rows from registers, more through a
        scratch); the fit past the largest measured size."""
        if n in self.points:
            return self.points[n]
        ns = sorted(self.points)
        if not ns or n > ns[-1]:
            return self(n)
        if n < ns[0]:
            return self.points[ns[0]]
        hi = next(i for i in ns if i > n)
        lo = max(i for i in ns if i < n)
        return self.points[lo] + (self.points[hi] - self.points[lo]) * (n - lo) / (hi - lo)

    def relative(self, n: int) -> float:
        """t(n) / t(1): what a pass over n rows costs in single-token steps."""
        return self(n) / self(1)

    def max_worthwhile(self, expected_tokens: Sequence[float]) -> int:
        """Largest n whose tokens per millisecond beat plain decoding's, given
        ``expected_tokens[n - 1]`` = expected tokens emitted by a pass over n rows (>= 1)."""
        best, best_rate = 1, 1.0 / self(1)
        for n, tokens in enumerate(expected_tokens, start=1):
            rate = tokens / self(n)
            if rate > best_rate:
                best, best_rate = n, rate
        return best

    def to_json(self) -> dict:
        return {"a_ms": round(self.a, 4), "b_ms": round(self.b, 5), "c_ms": round(self.c, 7),
                "points": {str(k): round(v, 3) for k, v in sorted(self.points.items())}}


def fit(points: dict[int, float], quadratic: bool = False) -> VerifyCost:
    """Least-squares fit of t(n) = a + b·n (+ c·n²) to measured {n: ms}."""
    ns = sorted(points)
    if len(ns) < (3 if quadratic else 2):
        raise ValueError("need at least 2 (linear) or 3 (quadratic) measured sizes")
    X = torch.tensor([[1.0, n] + ([n * n] if quadratic else []) for n in ns], dtype=torch.float64)
    y = torch.tensor([points[n] for n in ns], dtype=torch.float64)
    coef = torch.linalg.lstsq(X, y.unsqueeze(1)).solution.squeeze(1).tolist()
    return VerifyCost(coef[0], coef[1], coef[2] if quadratic else 0.0, dict(points))


@torch.inference_mode()
def measure(model, sizes: Sequence[int] = DEFAULT_SIZES, prefix: int = MEASURE_PREFIX, repeats: int = 5) -> dict[int, float]:
    """Median ms of ``model.verify`` over a chain of n rows after a ``prefix``-token committed
    context (a chain and a tree of n rows cost the same pass; only the mask differs). The model's
    cache is left empty.

    The sizes take turns, one pass each a round, so a slow spell of a shared machine falls on
    every size alike rather than on whichever was being measured (size after size, one such spell
    put a 16-row pass at 14 ms between 8 and 24 rows at 7 and 11: the curve the tree policies
    read, and so their tree sizes, followed the spell)."""
    g = torch.Generator().manual_seed(0)
    V = model.vocab_size
    model.allocate(prefix + max(sizes) + 1)
    model.prefill(torch.randint(0, V, (prefix,), generator=g).tolist())
    chains = {n: (torch.randint(0, V, (n,), generator=g).tolist(), list(range(-1, n - 1))) for n in sizes}
    for toks, parents in chains.values():
        model.verify(toks, parents)  # warm-up for each size
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n, (toks, parents) in chains.items():
            t0 = time.perf_counter()
            model.verify(toks, parents)
            samples[n].append((time.perf_counter() - t0) * 1000.0)
    model.cache.reset()
    return {n: statistics.median(v) for n, v in samples.items()}


def calibrate(model, sizes: Sequence[int] = DEFAULT_SIZES, **kw) -> VerifyCost:
    """Measure and fit; quadratic when the model has attention over the tree (c·n² term)."""
    return fit(measure(model, sizes, **kw), quadratic=len(sizes) >= 4)
