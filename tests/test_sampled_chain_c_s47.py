"""Session 47: a Mamba-2 drafter's sampled chain steps in C (Mamba2.draft_step_fast, its logits
left for the draw: ModelDrafter._chain_sampled_fast) as its greedy chain does. Its q rows are the
torch loop's up to the drafter's numerics (the same draws from the same seed), sd keeps the
target's exact law on a Mamba-2 target, and a drafter the C step does not serve falls back."""

from __future__ import annotations

import pytest
import torch

from engine import native
from engine.drafters.base import DraftRequest
from engine.drafters.model import ModelDrafter
from engine.generate import Decoder
from engine.loading import load
from engine.strategy import preset

from .lossless_util import draw, exact_law, law_pvalue, near_drafter
from .test_generate import P_PASS
from .tiny import saved

PROMPT = [3, 9, 4, 11, 5]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("c-chain"))
    return load(str(saved("mamba2", root))).model, load(str(near_drafter("mamba2", root))).model


def _propose(dec, seed, monkeypatch=None, torch_loop=False):
    md = dec.drafters["model"]
    if torch_loop:
        monkeypatch.setattr(ModelDrafter, "_chain_sampled_fast", lambda self, *a: None)
    req = DraftRequest(shape=(1, 1, 1, 1), max_nodes=16, mode="sample", temperature=0.9, top_p=0.95,
                       generator=torch.Generator().manual_seed(seed))
    md.reset()
    return md.propose(PROMPT, req)


@pytest.mark.skipif(native.lib() is None, reason="the C kernels are off here")
def test_the_c_chain_runs_and_matches_the_torch_loop(pair, monkeypatch):
    target, drafter = pair
    dec = Decoder(target, drafter)
    calls = {"c": 0}
    real = ModelDrafter._chain_sampled_fast

    def spy(self, *a):
        out = real(self, *a)
        calls["c"] += out is not None
        return out

    monkeypatch.setattr(ModelDrafter, "_chain_sampled_fast", spy)
    fast = [_propose(dec, s) for s in range(6)]
    assert calls["c"] == 6  # the C chain drafted every one
    with monkeypatch.context() as m:
        slow = [_propose(dec, s, m, torch_loop=True) for s in range(6)]
    for f, s in zip(fast, slow):
        assert f.sampling == s.sampling == "iid" and len(f) == 4 and f.parents == [-1, 0, 1, 2]
        assert f.tokens == s.tokens  # the same draws: q differs only by the drafter's numerics
        assert torch.allclose(f.draft_probs, s.draft_probs, atol=1e-4)


def test_sd_sampling_keeps_the_exact_law_with_the_c_chain(pair):
    target, drafter = pair
    s = preset("sd", draft_len=3, temperature=1.0)
    outs, accepted = draw(Decoder(target, drafter), PROMPT, s, range(2000), 2)
    assert law_pvalue(outs, exact_law(target, PROMPT, 1.0)) > P_PASS
    assert accepted > 0.3


def test_a_drafter_without_the_c_step_falls_back(pair, monkeypatch):

    target, drafter = pair
    dec = Decoder(target, drafter)
    monkeypatch.setattr(type(dec.drafters["model"].model), "draft_step_fast", lambda *a, **k: None)
    tree = _propose(dec, 1)
    assert len(tree) == 4 and tree.sampling == "iid" and torch.allclose(tree.draft_probs[:4].sum(-1), torch.ones(4))
