"""Session 45: top-k and min-p sampling cuts beside top-p (engine/sampling.probs_from_logits), for
plain sampling and every verifier (their losslessness: tests/test_generate.py's ``ar-cuts``,
``rs-top-k`` and ``mss-cuts`` cases against the exact law, and ``cuts-ignored`` showing that test
fails when the verifier drops the cuts).

Oracle for the cuts: transformers' logits warpers in its order (temperature, top-k, top-p, min-p)."""

from __future__ import annotations

import pytest
import torch

from engine.cli import main
from engine.sampling import probs_from_logits
from engine.strategy import Strategy, StrategyError, preset

from .test_cli_review_s42 import no_loading, one_error  # noqa: F401 - no_loading is a fixture

from app.commands import toggles
from app.store import strategy_from_dict


def _hf(logits, temperature, top_p=1.0, top_k=0, min_p=0.0):
    from transformers.generation.logits_process import (LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    procs = [TemperatureLogitsWarper(temperature)]
    if top_k:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    if min_p:
        procs.append(MinPLogitsWarper(min_p))
    scores = LogitsProcessorList(procs)(torch.zeros(logits.shape[0], 1, dtype=torch.long), logits.clone())
    return torch.softmax(scores, dim=-1)


@pytest.mark.parametrize("cuts", [dict(top_k=1), dict(top_k=7), dict(top_k=500), dict(min_p=0.05), dict(min_p=0.5),
                                  dict(top_k=40, min_p=0.02), dict(top_k=30, top_p=0.9), dict(top_k=50, top_p=0.8, min_p=0.1)])
@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.5])
def test_cuts_equal_transformers_warpers(cuts, temperature):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 300, generator=g) * 3  # distinct values: no ties at any cut
    ours = probs_from_logits(logits, temperature, **cuts)
    ref = _hf(logits, temperature, **cuts)
    assert torch.equal(ours > 0, ref > 0)  # the same kept sets
    assert torch.allclose(ours, ref, atol=1e-6)


def test_top_k_keeps_ties_with_the_kth():
    logits = torch.tensor([3.0, 1.0, 2.0, 2.0, 0.5])
    p = probs_from_logits(logits, 1.0, top_k=2)
    assert (p > 0).tolist() == [True, False, True, True, False]  # the k-th's ties stay, as transformers keeps them
    assert float(p.sum()) == pytest.approx(1.0)


def test_cuts_out_of_range_are_refused():
    for bad in (dict(top_k=-1), dict(top_k=2.5), dict(min_p=-0.1), dict(min_p=1.5)):
        with pytest.raises(ValueError):
            probs_from_logits(torch.zeros(4), 1.0, **bad)
        with pytest.raises(StrategyError):
            Strategy(temperature=1.0, **bad).validate()


def test_label_names_the_cuts_in_force():
    assert preset("sd", temperature=0.7, top_k=40, min_p=0.05).label().endswith("T=0.7 top-k=40 min-p=0.05")
    assert preset("sd", temperature=0.7, top_p=0.9).label().endswith("T=0.7 top-p=0.9")
    assert preset("sd", top_k=40).label().endswith("T=0")  # greedy: no cut applies


def test_saved_strategy_keeps_the_cuts():
    s = preset("tree", temperature=0.8, top_k=20, min_p=0.1)
    assert strategy_from_dict(s.to_dict()) == s
    old = s.to_dict()
    del old["top_k"], old["min_p"]  # a chat saved before the cuts existed
    assert strategy_from_dict(old).top_k == 0 and strategy_from_dict(old).min_p == 0.0
    with pytest.raises(StrategyError):
        strategy_from_dict({**s.to_dict(), "top_k": "40"})


def test_palette_sets_the_cuts_and_presets_carry_them():
    base = preset("sd", temperature=0.7)
    by = {(t.group, t.value): t for t in toggles()}
    s = by[("Top-k", "40")].change(base)
    s = by[("Min-p", "0.05")].change(s)
    s = by[("Top-p", "0.9")].change(s)
    assert (s.top_k, s.min_p, s.top_p) == (40, 0.05, 0.9)
    tree = by[("Strategy", "tree")].change(s)  # another preset keeps the sampling knobs
    assert (tree.name, tree.top_k, tree.min_p, tree.top_p, tree.temperature) == ("tree", 40, 0.05, 0.9, 0.7)


@pytest.mark.parametrize("knobs, says", [(("--top-k", "-3"), "top-k"), (("--min-p", "2"), "min-p"), (("--min-p", "nan"), "min-p")])
def test_cli_refuses_cuts_out_of_range(capsys, no_loading, knobs, says):  # noqa: F811
    assert says in one_error(capsys, "generate", "--strategy", "sd", "--temperature", "1", *knobs, "hi").lower()


def test_cli_samples_with_the_cuts(tmp_path_factory, capsys):
    from .tiny import saved

    import json

    target = saved("llama", str(tmp_path_factory.getbasetemp() / "cuts"))
    code = main(["generate", "--target", str(target), "--strategy", "ar", "--prompt-ids", "4,4,4", "--temperature", "1.0",
                 "--top-k", "1", "--seed", "5", "--max-new-tokens", "6", "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and out["strategy"]["top_k"] == 1
    greedy = main(["generate", "--target", str(target), "--strategy", "ar", "--prompt-ids", "4,4,4", "--max-new-tokens", "6", "--json"])
    ref = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert greedy == 0 and out["token_ids"] == ref["token_ids"]  # top-k 1 samples the argmax: greedy decoding
