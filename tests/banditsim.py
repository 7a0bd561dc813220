"""A simulated decode loop for the tree policies: static shapes drafted, the target's token drawn
among the drafter's ranked children with fixed per-rank probabilities, and per-shape drafting and
verify times (measured ones, from bench runs). Lets the bandit be judged the way the issue judges
it — time per emitted token against the best static arm — without a model, in milliseconds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from engine.policy import ShapeBandit, plan_from_shape


@dataclass
class Machine:
    """Per-shape (draft ms, verify ms) and the probability that the target's token is the drafter's
    rank-i child (0-based) at any node (0-th order, as exponential-races §4 estimates it)."""

    costs: dict[tuple[int, ...], tuple[float, float]]
    rank_accept: tuple[float, ...]
    target_ms: float  # one single-row target pass

    def step(self, shape: tuple[int, ...], rng: random.Random) -> tuple[list[int], list[int]]:
        """Draft ``shape``, verify: (parents of the drafted plan, accepted path of node indices)."""
        plan = list(plan_from_shape(shape))
        children: dict[int, list[int]] = {}
        for i, p in enumerate(plan):
            children.setdefault(p, []).append(i)
        path, node = [], -1
        while children.get(node):
            u, acc, hit = rng.random(), 0.0, None
            for rank, kid in enumerate(children[node]):
                acc += self.rank_accept[rank] if rank < len(self.rank_accept) else 0.0
                if u < acc:
                    hit = kid
                    break
            if hit is None:
                break
            path.append(hit)
            node = hit
        return plan, path


def run(machine: Machine, policy, steps: int, rng: random.Random, jitter: float = 0.1, slow: float = 1.0,
        switch: float = 0.0) -> tuple[float, int, list]:
    """``steps`` decode steps under ``policy`` (a ShapeBandit, or a fixed shape): (ms, tokens, picks).
    Times carry +-``jitter`` uniform noise per step, as a busy machine's do, and with ``switch`` > 0
    the whole machine changes speed between 1x and ``slow``x with that probability per step
    (another process taking a core for a while: measured 1.5x swings lasting minutes here)."""
    ms, tokens, picks = 0.0, 0, []
    speed = 1.0
    for _ in range(steps):
        if switch and rng.random() < switch:
            speed = slow if speed == 1.0 else 1.0
        shape = policy.choose() if isinstance(policy, ShapeBandit) else policy
        picks.append(shape)
        d, v = machine.costs[shape]
        d *= speed * (1 + rng.uniform(-jitter, jitter))
        v *= speed * (1 + rng.uniform(-jitter, jitter))
        parents, path = machine.step(shape, rng)
        if isinstance(policy, ShapeBandit):
            policy.observe(parents, path)
            policy.update(shape, len(path) + 1, d, v, len(parents) + 1)
        ms += d + v
        tokens += len(path) + 1
    return ms, tokens, picks


# Measured with the shipped drafter and SmolLM2-135M, fp32, on a 2-core AVX2 EPYC (session 5,
# /tmp/dbg/mab.py over bench prompts; bench --draft-cost): a 1-row target pass ~78 ms.
AVX2_FP32 = Machine(
    costs={(3, 2, 2, 1, 1): (45.0, 198.0), (3, 3, 2, 1): (41.0, 190.0), (2, 2, 2, 1, 1, 1): (66.0, 176.0),
           (1, 1, 1, 1, 1): (37.0, 79.0)},
    rank_accept=(0.45, 0.12, 0.06), target_ms=78.0)
# The AVX-512 machine of session 4 (bench/results/2026-11-21-issue10-cpu-hotpath.md): bf16, a
# 46-node tree ~3.5 plain steps, a 5-chain drafted in ~10 ms against an 11 ms step.
AVX512_BF16 = Machine(
    costs={(3, 2, 2, 1, 1): (17.0, 39.0), (3, 3, 2, 1): (15.0, 37.0), (2, 2, 2, 1, 1, 1): (21.0, 33.0),
           (1, 1, 1, 1, 1): (10.0, 13.5)},
    rank_accept=(0.47, 0.12, 0.06), target_ms=11.2)
# A machine where verification is nearly free (a GPU): wide trees win.
FLAT = Machine(
    costs={(3, 2, 2, 1, 1): (5.0, 10.5), (3, 3, 2, 1): (4.0, 10.5), (2, 2, 2, 1, 1, 1): (6.0, 10.3),
           (1, 1, 1, 1, 1): (5.0, 10.0)},
    rank_accept=(0.47, 0.15, 0.08), target_ms=10.0)
