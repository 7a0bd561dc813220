"""Soak (issue [hardening]): 2,000 decoding steps with the strategy switched at random every few
steps — every preset, both temperatures, attention and SSM targets. Greedy replies stay identical
to plain greedy decoding, caches hold exactly the committed tokens after every reply (no scratch
or slot left behind), and the process's memory does not grow past a stated bound."""

from __future__ import annotations

import gc
import random

import psutil
import pytest

from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.strategy import CYCLE, preset

from .tiny import saved

STEPS = 2000
RSS_BOUND_MB = 64  # growth allowed after the warm-up replies (allocator noise, pools at their high-water mark)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("soak"))


def _check_cache(dec: Decoder) -> None:
    """The target's cache holds exactly the committed tokens (the joint backtrack's pending
    chain aside) and no scratch node survives a step."""
    c = dec.target.cache
    assert c.length + len(dec._pending) == len(dec.history) - 1, (c.length, len(dec._pending), len(dec.history))
    assert not getattr(c, "scratch_parents", []), "target scratch left after a reply"
    for d in dec.drafters.values():
        m = getattr(d, "model", None)
        if m is not None:
            assert m.cache.length <= len(dec.history), "drafter cache ahead of the conversation"


@pytest.mark.parametrize("kind", ["llama", "mamba2"])
def test_two_thousand_steps_of_random_strategy_switches(kind, root):
    target = load(str(saved(kind, root))).model
    dec = Decoder(target, load(str(saved("draft", root))).model)
    rng = random.Random(0)
    prompts = [[1, 5, 9, 3, 5, 9, 3, 7, 2, 5, 9], [4, 4, 4, 4, 4, 4], list(range(10, 40)), [7, 80, 81, 82, 83, 7, 80, 81, 82]]
    ref = {i: [t for e in run_generation(dec, p, preset("ar"), 40)[0] for t in e.emitted] for i, p in enumerate(prompts)}
    proc = psutil.Process()
    steps = 0
    rss0 = None
    replies = 0
    while steps < STEPS:
        i = rng.randrange(len(prompts))
        greedy = rng.random() < 0.6
        temp = 0.0 if greedy else rng.choice([0.7, 1.0])
        state = {"s": preset(rng.choice(CYCLE), temperature=temp, seed=rng.randrange(1000)), "n": 0}

        def current():
            state["n"] += 1
            if state["n"] % rng.choice([2, 3, 5]) == 0:  # a live switch between steps
                state["s"] = preset(rng.choice(CYCLE), temperature=temp, seed=state["s"].seed,
                                    backtrack=rng.choice(["replay", "joint", "recompute"]))
            return state["s"]

        dec.reset() if rng.random() < 0.2 else None  # new conversations now and then
        evs, summ = run_generation(dec, prompts[i], current, 40)
        out = [t for e in evs for t in e.emitted]
        if greedy:
            assert out == ref[i], f"reply {replies}: greedy output changed after live switches"
        assert len(out) == 40
        steps += summ.steps
        replies += 1
        _check_cache(dec)
        if replies == 10:
            gc.collect()
            rss0 = proc.memory_info().rss / 2**20
    gc.collect()
    growth = proc.memory_info().rss / 2**20 - rss0
    print(f"soak {kind}: {steps} steps, {replies} replies, RSS growth after warm-up {growth:.1f} MB")
    assert growth < RSS_BOUND_MB, f"RSS grew {growth:.0f} MB over {steps} steps"
