"""Session 47: a drafter with a draft vocabulary (draft_vocab.json, as the shipped one's 8,192
tokens) samples its drafts over its own columns and hands the verifier q at their token ids. Every
sampled strategy keeps the target's exact law (the first two tokens, tests/lossless_util.exact_law);
a q that is not the distribution the draft was drawn from breaks it. The drafts use only the kept
tokens."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from engine.generate import Decoder
from engine.loading import load
from engine.strategy import preset

from .lossless_util import draw, exact_law, law_pvalue, near_drafter
from .test_generate import P_FAIL, P_PASS
from .tiny import saved

N = 2000
KEEP = list(range(0, 96, 2)) + list(range(1, 40, 2))  # 68 of the 96 tokens, not in id order's first block only
CASES = {"sd": preset("sd", draft_len=3, temperature=1.0),
         "tree": preset("tree", tree=(2, 2), temperature=1.0),
         "sd-cuts": preset("sd", draft_len=3, temperature=0.8, top_p=0.9, top_k=20)}
PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("dv-law"))
    target = load(str(saved("llama", root))).model
    dpath = tmp_path_factory.mktemp("dv-law2") / "draft"
    shutil.copytree(near_drafter("llama", root), dpath)
    (dpath / "draft_vocab.json").write_text(json.dumps({"token_ids": sorted(KEEP)}))
    drafter = load(str(dpath)).model
    assert drafter.draft_vocab is not None and len(drafter.draft_vocab) == len(KEEP)
    return target, drafter


def _law(target, s):
    return exact_law(target, PROMPT, s.temperature, **s.filters)


@pytest.mark.parametrize("name", list(CASES))
def test_draft_vocabulary_sampling_follows_the_exact_law(name, pair):
    target, drafter = pair
    s = CASES[name]
    dec = Decoder(target, drafter)
    outs, accepted = draw(dec, PROMPT, s, range(N), 2)
    assert law_pvalue(outs, _law(target, s)) > P_PASS
    assert accepted > 0.1  # the drafts do get accepted


def test_drafts_use_only_the_kept_tokens_and_q_sits_at_their_ids(pair):
    from engine.drafters.base import DraftRequest

    target, drafter = pair
    dec = Decoder(target, drafter)
    md = dec.drafters["model"]
    req = DraftRequest(shape=(2, 2), max_nodes=16, mode="sample", temperature=1.0, generator=torch.Generator().manual_seed(3))
    for _ in range(20):
        tree = md.propose(PROMPT, req)
        assert set(tree.tokens) <= set(KEEP)
        q = tree.draft_probs
        assert q is not None and torch.all(q[:, [i for i in range(96) if i not in KEEP]] == 0)
        for node, parent in enumerate(tree.parents):
            assert q[parent + 1, tree.tokens[node]] > 0  # a drafted token has mass in its parent's q
        assert torch.allclose(q[0].sum(), torch.tensor(1.0))


def test_the_law_test_sees_a_draw_that_is_not_q(pair, monkeypatch):
    """The drafts drawn from a flattened q while the verifier is told q: the law breaks."""
    import engine.drafters.model as M

    real = M.draft_sample
    monkeypatch.setattr(M, "draft_sample", lambda q, k, g, without_replacement: real(q.sqrt(), k, g, without_replacement))
    target, drafter = pair
    s = CASES["sd"]
    outs, _ = draw(Decoder(target, drafter), PROMPT, s, range(N), 2)
    assert law_pvalue(outs, _law(target, s)) < P_FAIL
