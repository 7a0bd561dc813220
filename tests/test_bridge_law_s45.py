"""Session 45: the vocabulary bridges' sampling checked against the target's exact law (the first
two tokens, tests/lossless_util.exact_law), with the power to see a verifier's mistake: the
two-sample test of tests/test_vocab.py (1,500 seeded draws against 1,500 of plain decoding) did
not see session 44's union bug (a draw outside the target vocabulary verified as accepted), and
checked its power only against the drafter's own distribution, far from the target's."""

from __future__ import annotations

import pytest

from engine.generate import Decoder
from engine.loading import load
from engine.strategy import preset

from .lossless_util import draw, exact_law, law_pvalue
from .test_generate import P_FAIL, P_PASS, _seeded
from .tiny import saved
from .test_vocab import fitted_byte_pair, root  # noqa: F401 - fixtures
from .vocab_pairs import trained_bpe

ALPHA = "abcdefghijklmnopqrstuvwxyz .,"
N = 2000
CASES = {"tli-sd": preset("sd", draft_len=3, vocab="tli", temperature=1.0),
         "tli-tree": preset("tree", tree=(2, 2), vocab="tli", temperature=1.0),
         "union-sd": preset("sd", draft_len=3, vocab="union", temperature=1.0),
         "slem-sd": preset("sd", draft_len=3, vocab="slem", temperature=1.0),
         "tli-rs-cuts": preset("sd", draft_len=3, vocab="tli", temperature=0.8, top_k=12, repeat_penalty=1.5, repeat_last_n=4)}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("bridge-law"))
    t = trained_bpe(96, alphabet=ALPHA)
    d = trained_bpe(96, alphabet=ALPHA, offset=2000)
    return load(str(saved("llama", root))).model, load(str(saved("draft", root))).model, t, d


def _case(name, pair):
    target, drafter, t, d = pair
    s = CASES[name]
    dec = Decoder(target, drafter, target_tokenizer=t, drafter_tokenizer=d)
    prompt = t.encode("the cat sat on the")
    law = _seeded(("bridge-law", id(pair), s.temperature, tuple(sorted(s.filters.items())), s.repeat_penalty, s.repeat_last_n),
                  lambda: exact_law(target, prompt, s.temperature, repeat=(s.repeat_penalty, s.repeat_last_n), **s.filters))
    return dec, prompt, law, s


@pytest.mark.parametrize("name", list(CASES))
def test_bridged_sampling_follows_the_exact_law(name, pair):
    dec, prompt, law, s = _case(name, pair)
    outs, accepted = draw(dec, prompt, s, range(N), 2)
    assert law_pvalue(outs, law) > P_PASS
    assert accepted > (0 if name.startswith("slem") else 0.05)  # the bridge's drafts do get accepted (slem's strings rarely, sampling)


@pytest.mark.parametrize("name", ["tli-sd", "union-sd"])
def test_the_law_test_sees_a_residual_drawn_from_p(name, pair, monkeypatch):
    import engine.verify as V

    monkeypatch.setattr(V, "residual", lambda p, q: p)
    dec, prompt, law, s = _case(name, pair)
    outs, _ = draw(dec, prompt, s, range(N), 2)
    assert law_pvalue(outs, law) < P_FAIL


@pytest.mark.slow
def test_slrs_with_cuts_and_a_penalty_follows_the_exact_law(fitted_byte_pair):
    """SLRS (string-level rejection sampling, a byte-level drafter) with top-k, min-p and a repeat
    penalty: psi from the drafter's cut q, the target's rows cut and penalised (~30 s: slow set)."""
    from engine.tokenizer import ByteTokenizer

    target, drafter, t, prompt, _ = fitted_byte_pair
    dec = Decoder(target, drafter, target_tokenizer=t, drafter_tokenizer=ByteTokenizer())
    s = preset("sd", draft_len=2, vocab="slrs", temperature=1.0, top_k=8, min_p=0.05, repeat_penalty=1.5, repeat_last_n=3)
    law = exact_law(target, prompt, 1.0, repeat=(1.5, 3), top_k=8, min_p=0.05)
    outs, accepted = draw(dec, prompt, s, range(1500), 2)
    assert accepted > 0.2
    assert law_pvalue(outs, law) > P_PASS
