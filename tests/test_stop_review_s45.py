"""Session 45 review of `generate --stop` (Decoder.steps(stop_strings=...)): cases the feature's own
tests leave out, each checked against plain greedy decoding (``ar``) with the same stop strings:
an SSM target under each --backtrack mode (the cache, a joint step's pending chain, and the next
turn), and the stop search over a step's tokens (``_stop_cut``) on multi-byte text, whatever the
grouping of tokens into steps (a stop begun in one step and completed in a later one)."""

from __future__ import annotations

import random

import pytest

from engine.generate import Decoder, _stop_cut, run_generation
from engine.loading import load
from engine.strategy import from_spec, preset
from engine.tokenizer import StreamDecoder

from .lossless_util import near_drafter
from .tiny import saved
from .vocab_pairs import trained_bpe

ALPHA = "abcdefghijklmnopqrstuvwxyz .,"


def _steps_cut(tok, seq, groups, stops, eos=frozenset()):
    """Decoder.steps' stop logic over ``seq`` split into steps of ``groups`` tokens: the reply's tokens."""
    dec, tail, out, i = StreamDecoder(tok), "", [], 0
    for g in groups:
        emitted, i = seq[i:i + g], i + g
        cut = _stop_cut(dec, emitted, tail, stops, eos)
        if cut is not None:
            return out + emitted[:cut]
        out += emitted
        text = dec.push(emitted[:-1]) + dec.push(emitted[-1:])
        tail = (tail + text)[-max(map(len, stops)):]
    return out


def test_multibyte_stops_cut_at_the_same_token_however_steps_group_them(smollm2_gguf_path):
    from engine.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(smollm2_gguf_path)
    rng = random.Random(0)
    texts = ["emoji 😀🎉 party 👍🏽 ok 🌍🌍", "你好世界，这是一个测试。我爱你，中国。", "naïve café — déjà vu «oui»"]
    checked = 0
    for _ in range(300):
        seq = tok.encode(rng.choice(texts) + rng.choice(texts))
        full = tok.decode(seq)
        a = rng.randrange(len(full) - 1)
        stops = [full[a:a + rng.randint(1, 3)]]
        single = _steps_cut(tok, seq, [1] * len(seq), stops)  # plain decoding: a token a step
        assert stops[0] in tok.decode(single) and stops[0] not in tok.decode(single[:-1]).rstrip("\ufffd")
        groups = []
        while sum(groups) < len(seq):
            groups.append(rng.randint(1, 6))
        assert _steps_cut(tok, seq, groups, stops) == single, (stops, groups)
        checked += any(ord(c) > 127 for c in stops[0])
    assert checked > 50
    # a token that ends a stop string and begins a character (" \\xf0\\x9f": a space, half an emoji)
    # completes the stop itself: the reply ends there, not a token later with the emoji whole
    seq = tok.encode("party ok 🌍 now")
    k = next(i for i, t in enumerate(seq) if tok.token_bytes(t) == b" \xf0\x9f")
    assert _steps_cut(tok, seq, [1] * len(seq), ["ok "]) == seq[:k + 1]
    assert _steps_cut(tok, seq, [len(seq)], ["ok "]) == seq[:k + 1]
    # one emoji whose bytes span several tokens
    seq = tok.encode("ab 🌍 cd")
    assert len([t for t in seq if not tok.decode([t]).isascii()]) > 1
    assert tok.decode(_steps_cut(tok, seq, [len(seq)], ["🌍"])) == "ab 🌍"


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("stop-review"))
    tok = trained_bpe(96, alphabet=ALPHA)
    dec = Decoder(load(str(saved("mamba2", root))).model, load(str(near_drafter("mamba2", root))).model,
                  detokenize=lambda: StreamDecoder(tok))
    return dec, tok, tok.encode("the cat sat on the mat. the cat sat on the")


def _run(dec, prompt, s, n, stops=(), reset=True):
    if reset:
        dec.reset()
    evs, _ = run_generation(dec, prompt, s, n, stop_strings=stops)
    return [t for e in evs for t in e.emitted], "".join(e.text for e in evs), evs[-1].finish_reason


@pytest.mark.parametrize("backtrack", ["replay", "joint", "recompute"])
def test_ssm_target_stops_where_plain_decoding_does_and_the_next_turn_is_unchanged(mamba, backtrack):
    dec, tok, prompt = mamba
    full = _run(dec, prompt, preset("ar"), 30)[1]
    for stop in (full[9:11], full[20:22]):
        want = _run(dec, prompt, preset("ar"), 30, [stop])
        assert want[2] == "stop_string"
        for n in (len(want[0]) - 1, len(want[0]), 30):  # the limit before the stop's token, at it, beyond
            ref = _run(dec, prompt, preset("ar"), n, [stop])
            for spec in ("sd", "tree", "hybrid"):
                s = from_spec(spec).replace(backtrack=backtrack)
                got = _run(dec, prompt, s, n, [stop])
                assert got == ref, (spec, stop, n)
                assert dec.target.cache.length + len(dec._pending) == len(dec.history) - 1
                nxt = dec.history + tok.encode(" the mat")
                after = _run(dec, nxt, s, 8, reset=False)[0]
                assert after == _run(dec, nxt, preset("ar"), 8)[0], (spec, stop, n)
