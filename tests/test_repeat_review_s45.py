"""Session 45 review of the repetition penalty (tests/test_repeat_penalty_s45.py): the greedy-identity
check carried to the modes whose verify rows are laid out otherwise (an SSM or hybrid target's
pending chain with --backtrack joint, recompute, --ssm-tree unrolled), to the drafts a datastore
makes (hybrid's mixed chain, hybrid:auto's and pld:auto's trees), to the vocabulary bridges, and to
a reply continued or a conversation edited (the window is the decoder's history); and a penalty
too small to sample with, refused (it made every recent token's logit inf: a traceback mid-reply).

A short window and a strong penalty (3.0 over 2 tokens): a row's own path decides its window."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.drafters.corpus import CorpusIndex
from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.strategy import MIN_REPEAT_PENALTY, StrategyError, from_spec, preset

from .lossless_util import near_drafter, tokens_of
from .test_cli_review_s42 import no_loading, one_error  # noqa: F401 - no_loading is a fixture
from .tiny import saved

PROMPTS = ([5, 9, 12, 5, 9, 12, 5, 9, 30, 31, 5, 9, 12, 5, 9], [3, 1, 4, 1, 5, 9, 2, 6], list(range(10, 30)))
REP = dict(repeat_penalty=3.0, repeat_last_n=2)
REWARD = dict(repeat_penalty=0.3, repeat_last_n=2)  # < 1: the last two tokens favoured
N = 24


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("repeat-review"))


def _pair(kind, root):
    return Decoder(load(str(saved(kind, root))).model, load(str(near_drafter(kind, root))).model)


def _out(dec, prompt, s, n=N):
    dec.reset()
    evs, _ = run_generation(dec, prompt, s, n)
    return tokens_of(evs), sum(e.accepted for e in evs)


SSM_MODES = [{"backtrack": "joint"}, {"backtrack": "recompute"}, {"ssm_tree": "unrolled"},
             {"backtrack": "joint", "ssm_tree": "unrolled"}, {"backtrack": "recompute", "ssm_tree": "unrolled"}]
SPECS = ["pld", "sd", "tree", "mab", "optimal", "ersd", "hybrid", "sd:auto", "pld:auto"]


@pytest.mark.parametrize("kind", ["mamba2", "granite"])
def test_ssm_modes_greedy_equal_plain_greedy_with_the_penalty(kind, root):
    """The pass holds a joint step's pending chain before the root, or every path unrolled: the
    rows the penalty reads must still be (root, tree nodes)."""
    dec = _pair(kind, root)
    accepted = changed = 0
    for rep in (REP, REWARD):  # (granite's greedy reply repeats nothing in 2 tokens: the reward changes it)
        ref, _ = _out(dec, PROMPTS[0], preset("ar", **rep))
        changed += ref != _out(dec, PROMPTS[0], preset("ar"))[0]
        for spec in SPECS:
            for mode in SSM_MODES:
                out, acc = _out(dec, PROMPTS[0], from_spec(spec).replace(**rep, **mode))
                assert out == ref, (kind, spec, mode, rep)
                accepted += acc
    assert changed and accepted > 100


@pytest.mark.parametrize("kind", ["llama", "mamba2"])
def test_datastore_drafts_greedy_equal_plain_greedy_with_the_penalty(kind, root):
    """hybrid greedy's mixed chain (copy, datastore and drafter token by token), hybrid:auto's and
    pld:auto's best-first trees: a datastore of penalised and unpenalised replies."""
    dec = _pair(kind, root)
    seqs = [(list(p) + _out(dec, p, preset("ar", **r), 30)[0], len(p)) for p in PROMPTS for r in (REP, {})]
    ix = CorpusIndex.build(seqs, n_max=4, min_count=1)
    accepted = 0
    for p in PROMPTS:
        ref, _ = _out(dec, p, preset("ar", **REP))
        for spec in ("hybrid", "hybrid:4", "hybrid:auto", "pld:auto"):
            for mode in ({}, {"backtrack": "joint"}) if kind == "mamba2" else ({},):
                dec.reset()
                dec.drafters["ngram"].corpus = ix
                try:
                    evs, _ = run_generation(dec, p, from_spec(spec).replace(**REP, **mode), N)
                finally:
                    dec.drafters["ngram"].corpus = None
                assert tokens_of(evs) == ref, (kind, spec, mode, p)
                accepted += sum(e.accepted for e in evs)
    assert accepted > 100


def test_bridged_drafts_greedy_equal_plain_greedy_with_the_penalty(root):
    """A drafter of another vocabulary (the target under shuffled ids, its tokenizer shuffled
    alike): its drafts are translated into target tokens, each row still the target's own."""
    from .test_vocab import ALPHA, permuted_copy
    from .vocab_pairs import permuted, trained_bpe

    tok = trained_bpe(96, alphabet=ALPHA)
    ptok, perm = permuted(tok, seed=3)
    src = saved("llama", root)
    drafter = load(str(permuted_copy(src, Path(root) / "llama-permuted", perm))).model
    dec = Decoder(load(str(src)).model, drafter, target_tokenizer=tok, drafter_tokenizer=ptok)
    assert dec.bridged
    prompt = tok.encode("the cat sat on the mat, and then the cat sat")
    ref, _ = _out(dec, prompt, preset("ar", **REP), 30)
    assert ref != _out(dec, prompt, preset("ar"), 30)[0]
    accepted = 0
    for spec in ("sd@tli", "sd@union", "sd@slem", "tree:2-2-1@tli", "tree:2-2-1@slem", "mab@tli", "optimal@slem", "hybrid@tli"):
        out, acc = _out(dec, prompt, from_spec(spec).replace(**REP), 30)
        assert out == ref, spec
        accepted += acc
    assert accepted > 60


@pytest.mark.parametrize("kind, mode", [("llama", {}), ("mamba2", {"backtrack": "joint"})])
def test_a_continued_reply_and_an_edited_conversation_window_over_the_history(kind, root, mode):
    """Continue: a reply cut at 10 tokens and continued from the prompt and its tokens is the
    reply written at once; an edited conversation (a prompt sharing a prefix with the last one, a
    cache reused) is penalised over its own history, not the last reply's."""
    dec = _pair(kind, root)
    p = PROMPTS[0]
    ref, _ = _out(dec, p, preset("ar", **REP))
    for spec in ("sd", "tree", "pld"):
        s = from_spec(spec).replace(**REP, **mode)
        dec.reset()
        first = tokens_of(run_generation(dec, p, s, 10)[0])
        rest = tokens_of(run_generation(dec, p + first, s, N - 10)[0])  # a cache holding the reply: reused
        assert first + rest == ref, (spec, mode)
        edited = p[:9] + [40, 41]
        want = _out(dec, edited, preset("ar", **REP))[0]
        dec.reset()
        run_generation(dec, p, s, 12)
        assert tokens_of(run_generation(dec, edited, s, N)[0]) == want, (spec, mode)


# ---- a penalty too small to sample with ------------------------------------------------------------------------
def test_a_penalty_too_small_to_sample_with_is_refused(root):
    """1e-300 is 0 in float32: every recent token's positive logit became inf and sampling raised
    "probability tensor contains inf or nan" mid-reply; refused like a temperature that small."""
    for r in (1e-300, 1e-40, 1e-9):
        with pytest.raises(StrategyError, match="too small"):
            preset("sd", repeat_penalty=r).validate()
    s = preset("ar", repeat_penalty=MIN_REPEAT_PENALTY, repeat_last_n=4, temperature=1.0)
    s.validate()
    dec = Decoder(load(str(saved("llama", root))).model)
    assert len(_out(dec, PROMPTS[0], s, 12)[0]) == 12  # the floor samples


@pytest.mark.parametrize("cmd", [("generate", "--temperature", "1", "hi"), ("bench", "--verify-cost")])
def test_cli_refuses_a_penalty_too_small_before_loading(capsys, no_loading, cmd):  # noqa: F811
    assert "--repeat-penalty 1e-300 is too small" in one_error(capsys, cmd[0], "--repeat-penalty", "1e-300", *cmd[1:])
