"""Session 45: the repetition penalty (--repeat-penalty R over --repeat-last-n N tokens; the CTRL
penalty of transformers' RepetitionPenaltyLogitsProcessor and llama.cpp's repeat_penalty). Each
verify row is penalised over its own context (the history, then its path in the tree), so every
strategy's greedy output equals greedy plain decoding with the same penalty; sampling: the
``rs-repeat`` exact-law case in tests/test_generate.py.

Oracles: transformers' processor and its ``generate(repetition_penalty=...)`` (a window longer than
the whole context: transformers penalises all of it)."""

from __future__ import annotations

import pytest
import torch

from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.sampling import repeat_penalized
from engine.strategy import StrategyError, preset
from engine.tree import TokenTree

from app.commands import toggles
from app.store import strategy_from_dict

from .lossless_util import near_drafter
from .test_cli_review_s42 import no_loading, one_error  # noqa: F401 - no_loading is a fixture
from .tiny import saved

PROMPT = [5, 9, 12, 5, 9, 12, 5, 9, 30, 31, 5, 9, 12, 5, 9]  # repeats itself: prompt lookup drafts


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("repeat"))


def test_penalty_equals_transformers_processor():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 40, generator=g)
    windows = [[1, 2, 2, 5, 39], [7, 3], []]
    for penalty in (0.7, 1.3, 2.0):
        ref = torch.stack([RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([w], dtype=torch.long), logits[i:i + 1].clone())[0]
                           if w else logits[i] for i, w in enumerate(windows)])
        out = repeat_penalized(logits, windows, penalty)
        assert torch.equal(out, ref)
    assert torch.equal(logits, torch.randn(3, 40, generator=torch.Generator().manual_seed(0)))  # not written


def test_windows_are_each_rows_own_context(root):
    dec = Decoder(load(str(saved("llama", root))).model)
    dec.start([1, 2, 3, 4, 5])
    tree = TokenTree([10, 11, 12, 13], [-1, 0, 0, 2])  # 10 -> 11, 10 -> 12 -> 13
    assert dec._windows(tree, 3) == [[3, 4, 5], [4, 5, 10], [5, 10, 11], [5, 10, 12], [10, 12, 13]]
    assert dec._windows(tree, 1) == [[5], [10], [11], [12], [13]]


def _greedy(dec, strategy, n=24):
    dec.reset()
    evs, _ = run_generation(dec, PROMPT, strategy, n)
    return [t for e in evs for t in e.emitted]


def test_plain_greedy_with_the_penalty_equals_transformers(root):
    path = saved("llama", root)
    from .tiny import _hf_model

    with torch.no_grad():
        ref = _hf_model(path).generate(torch.tensor([PROMPT]), attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
                                       max_new_tokens=20, min_new_tokens=20, do_sample=False, repetition_penalty=1.3,
                                       eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()
    dec = Decoder(load(str(path)).model)
    ours = _greedy(dec, preset("ar", repeat_penalty=1.3, repeat_last_n=4096), 20)
    assert ours == ref
    assert ours != _greedy(dec, preset("ar"), 20)  # the penalty changed the reply


STRATEGIES = ["pld", "sd", "tree", "mab", "optimal", "hybrid", "ersd", "pld:auto", "sd:auto"]


@pytest.mark.parametrize("kind", ["llama", "mamba2"])
def test_every_strategy_greedy_equals_plain_greedy_with_the_penalty(kind, root):
    from engine.strategy import from_spec

    target = load(str(saved(kind, root))).model
    dec = Decoder(target, load(str(near_drafter(kind, root))).model)
    # (< 1 rewards repeats: pld's drafts then match more; a short window and a strong penalty make
    # a row's path decide its window: test_a_penalty_blind_to_the_path_is_caught)
    for penalty, n in ((1.5, 6), (0.8, 64), (3.0, 2)):
        ref = _greedy(dec, preset("ar", repeat_penalty=penalty, repeat_last_n=n))
        assert ref != _greedy(dec, preset("ar"))
        accepted = 0
        for spec in STRATEGIES:
            s = from_spec(spec).replace(repeat_penalty=penalty, repeat_last_n=n)
            dec.reset()
            evs, _ = run_generation(dec, PROMPT, s, 24)
            assert [t for e in evs for t in e.emitted] == ref, (kind, spec, penalty)
            accepted += sum(e.accepted for e in evs)
        assert accepted > 20  # speculation ran


def test_a_penalty_blind_to_the_path_is_caught(root, monkeypatch):
    """The check above has the power to see a verify row penalised over the history alone."""
    target = load(str(saved("llama", root))).model
    dec = Decoder(target, load(str(near_drafter("llama", root))).model)
    ref = _greedy(dec, preset("ar", repeat_penalty=3.0, repeat_last_n=2))
    monkeypatch.setattr(Decoder, "_windows", lambda self, tree, n: [self.history[-n:]] * (len(tree) + 1))
    outs = [_greedy(dec, preset(name, repeat_penalty=3.0, repeat_last_n=2)) for name in ("pld", "sd", "tree")]
    assert any(o != ref for o in outs)


def test_strategy_label_store_and_palette():
    s = preset("sd", repeat_penalty=1.2, repeat_last_n=32)
    assert s.label().endswith("T=0 rep=1.2/32")
    assert strategy_from_dict(s.to_dict()) == s
    old = s.to_dict()
    del old["repeat_penalty"], old["repeat_last_n"]  # a chat saved before the penalty existed
    assert strategy_from_dict(old).repeat_penalty == 1.0
    for bad in (dict(repeat_penalty=0.0), dict(repeat_penalty=11.0), dict(repeat_last_n=0), dict(repeat_last_n=2.5)):
        with pytest.raises(StrategyError):
            preset("sd", **bad).validate()
    by = {(t.group, t.value): t for t in toggles()}
    greedy = preset("sd")
    t = by[("Repeat penalty", "1.2")].change(greedy)
    assert t.repeat_penalty == 1.2 and t.temperature == 0.0  # greedy decoding reads it too
    assert by[("Strategy", "tree")].change(t).repeat_penalty == 1.2  # presets carry it


@pytest.mark.parametrize("argv, says", [
    (("generate", "--repeat-penalty", "0", "hi"), "--repeat-penalty must be in (0, 10]"),
    (("generate", "--repeat-penalty", "nan", "hi"), "--repeat-penalty must be a finite number"),
    (("generate", "--repeat-last-n", "0", "hi"), "--repeat-last-n must be at least 1"),
    (("bench", "--compare", "transformers", "--repeat-penalty", "1.2"), "without --repeat-penalty"),
])
def test_cli_refuses_before_loading(capsys, no_loading, argv, says):  # noqa: F811
    assert says in one_error(capsys, *argv)
