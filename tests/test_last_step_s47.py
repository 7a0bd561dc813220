"""Session 47: a greedy reply's last step drafts nothing when one token remains (the verify pass's own
argmax is that token: a draft could only be cut); sampling keeps its draft there, so a seed's reply
stays the prefix of a longer reply with the same seed. Oracle: plain greedy decoding."""

from __future__ import annotations

import pytest

from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.strategy import from_spec, preset

from .lossless_util import near_drafter
from .tiny import saved

PROMPT = [5, 9, 13, 5, 9, 13, 5, 9, 13, 5, 9]


@pytest.fixture(scope="module")
def dec(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("last"))
    return Decoder(load(str(saved("llama", root))).model, load(str(near_drafter("llama", root))).model)


def _run(dec, s, n):
    dec.reset()
    evs, _ = run_generation(dec, PROMPT, s, n)
    return [t for e in evs for t in e.emitted], [e for e in evs if e.emitted]


@pytest.mark.parametrize("spec", ["pld", "sd", "tree", "mab", "optimal", "hybrid", "sd:auto", "pld:auto"])
def test_the_last_greedy_token_is_not_drafted(dec, spec):
    want, _ = _run(dec, preset("ar"), 24)
    for n in range(1, 9):
        got, steps = _run(dec, from_spec(spec), n)
        assert got == want[:n]
        assert steps[-1].drafted == 0 or sum(len(e.emitted) for e in steps[:-1]) < n - 1, (n, steps[-1])
    _, steps = _run(dec, from_spec(spec), 1)
    assert [e.drafted for e in steps] == [0]


@pytest.mark.parametrize("spec", ["sd:4", "pld"])
def test_sampling_keeps_its_last_draft_so_a_seed_reply_is_a_prefix(dec, spec):
    s = from_spec(spec).replace(temperature=0.9, seed=7)
    if spec == "pld":
        s = s.replace(verify="membership")
    long, _ = _run(dec, s, 24)
    for n in (1, 5, 11):
        got, steps = _run(dec, s, n)
        assert got == long[:n]
    _, steps = _run(dec, s, 1)
    assert steps[-1].drafted > 0
