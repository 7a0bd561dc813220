"""Vocabulary bridges with sentencepiece tokenizers (session 42 review): a tiny llama target whose
tokenizer is a Llama-2 style sentencepiece vocabulary rebuilt from GGUF metadata (tests/test_gguf_spm:
``▁`` for spaces, ``<0xNN>`` byte-fallback pieces, a "▁" prefix the encoder adds to each text),
drafted by (a) a byte-level Mamba-2 drafter and (b) a llama drafter with a byte-level BPE; and a
sentencepiece drafter under a byte-level target.

Every bridge stays plain greedy decoding (it did before too: exact-match verification does not
depend on the proposal). What was wrong was the proposals: a sentencepiece vocabulary spells most
single bytes twice ("t" and <0x74>), and the bridges paired/proposed the byte-fallback piece (lower
id), which the target never writes, so TLI/union/SLRS drafts of single-character tokens were always
rejected; SLEM re-encoded drafts with the encoder's "▁" prefix and proposed nothing at all. On the
drafter side the same double spelling put two q columns on one target id, of which TLI kept one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.drafters.vocab import BridgeDrafter, VocabMap
from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.slrs import TargetTrie
from engine.strategy import preset
from engine.tokenizer import ByteTokenizer, Tokenizer

from .accept_util import bigram_model, chain_bigram
from .test_gguf_spm import metadata, spm_vocab
from .vocab_pairs import trained_bpe

CHAT = "<s>[INST] Hi [/INST]"
# every byte once (a byte drafter's next byte is a function of its last); "€" has no piece of its
# own (three <0xNN> pieces), "\n" is <0x0A>; the first period starts with the encoder's "▁" prefix
TEXT = "the,quick-brown:lazy.12€\n"


def tokens_of(events):
    return [t for e in events for t in e.emitted]


@pytest.fixture(scope="module")
def spm():
    tokens, types, scores = spm_vocab()
    return Tokenizer.from_gguf(metadata(tokens, types, scores))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return Path(tmp_path_factory.mktemp("vocab-spm"))


@pytest.fixture(scope="module")
def spm_target(spm, root):
    """A designed target (tests/accept_util.bigram_model) answering CHAT with TEXT over and over in
    the sentencepiece ids; returns (model, prompt, the target's history bytes of the reply)."""
    prompt = spm.encode(CHAT)
    full = spm.encode(CHAT + TEXT * 4)
    assert full[:len(prompt)] == prompt
    chain = full[len(prompt) - 1:]
    pieces = [spm.id_to_token(i) for i in chain]
    assert pieces[:4] == ["[/INST]", "▁the", ",", "q"] and "<0xE2>" in pieces and "<0x0A>" in pieces and "t" in pieces
    model = load(str(bigram_model(root / "spm-target", "llama", spm.vocab_size, chain_bigram(chain), {chain[1]: 8.0},
                                  base=0.0))).model
    return model, prompt, chain


def _check_greedy(dec, prompt, strategies, n=24, min_accepted=None):
    ref = tokens_of(run_generation(dec, prompt, preset("ar"), n)[0])
    out = {}
    for name, s in strategies:
        evs, _ = run_generation(dec, prompt, s, n)
        assert tokens_of(evs) == ref, name
        out[name] = (sum(e.accepted for e in evs), sum(e.drafted for e in evs))
        if min_accepted is not None:
            assert out[name][0] >= min_accepted, (name, [(e.accepted, e.drafted) for e in evs])
    return ref, out


# ---- token maps ------------------------------------------------------------------------------------------
def test_byte_fallback_pieces_are_known_to_the_tokenizer(spm):
    ids = {spm.id_to_token(i): i for i in range(spm.vocab_size)}
    assert spm.is_byte_piece(ids["<0x74>"]) and spm.is_byte_piece(ids["<0xE2>"])
    assert not spm.is_byte_piece(ids["t"]) and not spm.is_byte_piece(ids["<s>"]) and not spm.is_byte_piece(ids["▁the"])
    assert spm.token_bytes(ids["<0x74>"]) == spm.token_bytes(ids["t"]) == b"t"
    assert not ByteTokenizer().is_byte_piece(0x74) and not trained_bpe(1200, "bytelevel").is_byte_piece(5)


def test_vocab_map_pairs_bytes_with_the_pieces_a_sentencepiece_target_writes(spm):
    """Was: every byte mapped to its <0xNN> piece (lower ids), which the target never writes."""
    m = VocabMap(spm, ByteTokenizer())
    for b in b"the,q1\n ":
        t = int(m.d2t[b])
        want = spm.encode("a" + chr(b))[-1] if b != ord(" ") else spm.token_to_id("▁")
        assert t == want, (chr(b), spm.id_to_token(t))
    assert spm.id_to_token(int(m.d2t[0xE2])) == "<0xE2>"  # no piece of its own: the byte piece
    assert int(m.d2t[ByteTokenizer.EOS]) == m.target_eos == spm.eos_id
    assert len(set(m.shared_t.tolist())) == m.size


def test_a_sentencepiece_drafter_puts_one_q_column_on_each_target_id(spm):
    """A sentencepiece drafter spells "t" twice ("t", <0x74>): both mapped to the target's "t", and
    TLI's layout over target ids kept one column of the two, so q(t) was understated (rejection
    sampling accepting too often: not lossless at T > 0). Now each target id has one drafter id."""
    target = trained_bpe(1200, "bytelevel")
    m = VocabMap(target, spm)
    assert len(set(m.shared_t.tolist())) == m.size
    ids = {spm.id_to_token(i): i for i in range(spm.vocab_size)}
    t_id = target.encode("t")[0]
    assert int(m.d2t[ids["t"]]) == t_id and int(m.d2t[ids["<0x74>"]]) == -1
    assert int(m.d2t[ids["<0xE2>"]]) == -1 or target.token_bytes(int(m.d2t[ids["<0xE2>"]])) == b"\xe2"
    # q over the intersection (TLI: renormalised there) keeps all its mass once laid out on target ids
    g = torch.Generator().manual_seed(0)
    q = torch.zeros(3, spm.vocab_size)
    q[:, m.shared_d] = torch.rand(3, m.size, generator=g)
    q = q / q.sum(-1, keepdim=True)
    out = m.to_target_probs(q, target.vocab_size)
    assert torch.allclose(out.sum(-1), torch.ones(3), atol=1e-6)
    assert torch.allclose(out[:, t_id], q[:, ids["t"]])


def test_slrs_trie_proposes_the_normal_piece(spm):
    trie = TargetTrie.of_tokenizer(spm)
    assert spm.id_to_token(trie.token[trie.node_of(b"t")]) == "t"
    assert spm.id_to_token(trie.token[trie.node_of(b"\n")]) == "<0x0A>"  # only the byte piece spells it
    assert spm.id_to_token(trie.token[trie.node_of(b"\xe2")]) == "<0xE2>"
    assert spm.token_to_id("<0x74>") not in trie.string


# ---- SLEM's re-tokenization under the encoder's "▁" prefix -----------------------------------------------
def test_slem_retokenizes_past_the_encoders_prefix_space(spm, spm_target, root):
    """Was: the target's encoder writes " world" as "▁" "▁world" and "lo" as "▁lo", so the
    look-behind never found the root first and the draft's own encoding started with bytes the draft
    did not say: SLEM proposed nothing (or a lone "▁")."""
    drafter = load(str(bigram_model(root / "spm-any-bytes", "mamba2", 264, {}, {ord("t"): 8.0}, base=0.0))).model
    br = BridgeDrafter(drafter, spm, ByteTokenizer(), spm.vocab_size)
    br.draft_cut = "none"
    hello = spm.encode("Hello")
    root = hello[-1]
    assert spm.id_to_token(root) == "▁Hello"
    got = br._retokenize(list(b" world, the"), root, spm.token_bytes(root), b"")
    assert got == spm.encode("Hello world, the")[1:] and b"".join(spm.token_bytes(i) for i in got) == b" world, the"
    # mid-word: the draft finishes the root's word; its tokens are the text's without the prefix
    he = spm.token_to_id("he")
    got = br._retokenize(list(b"llo there"), he, spm.token_bytes(he), b"")
    assert b"".join(spm.token_bytes(i) for i in got) == b"llo there" and got
    # byte-fallback characters and the end of turn
    got = br._retokenize(list(" €1".encode()) + [ByteTokenizer.EOS], root, spm.token_bytes(root), b"")
    assert got == spm.encode("Hello €1")[1:] + [spm.eos_id]
    # the default cut: what ends before the draft's last word
    br.draft_cut = "piece"
    got = br._retokenize(list(b" world, the"), root, spm.token_bytes(root), b"")
    assert got and b" world, the".startswith(b"".join(spm.token_bytes(i) for i in got))


# ---- greedy through the decode loop --------------------------------------------------------------------
BRIDGES = [
    ("tli", preset("sd", draft_len=4, vocab="tli")),
    ("union", preset("sd", draft_len=4, vocab="union")),
    ("slem", preset("sd", draft_len=8, vocab="slem")),
    ("auto", preset("sd", draft_len=8)),
    ("tli-tree", preset("tree", tree=(2, 2, 1), vocab="tli")),
    ("slem-tree", preset("tree", tree=(2, 2, 1, 1, 1, 1, 1, 1), vocab="slem")),
]


def test_byte_drafter_on_a_sentencepiece_target_every_bridge_is_plain_greedy(spm, spm_target, root):
    """(a) a byte-level Mamba-2 drafter that spells the target's history bytes: every bridge is the
    target's greedy output, and now its drafts are accepted (before: 4 of 80 tokens for TLI/union,
    none proposed by SLEM, 6 of 72 for SLRS)."""
    model, prompt, chain = spm_target
    hist = b"".join(spm.token_bytes(i) for i in chain)
    drafter = load(str(bigram_model(root / "spm-bytes", "mamba2", 264, chain_bigram(list(hist)), {ord("t"): 8.0},
                                    base=0.0))).model
    dec = Decoder(model, drafter, target_tokenizer=spm, drafter_tokenizer=ByteTokenizer())
    assert dec.bridged
    ref, acc = _check_greedy(dec, prompt, BRIDGES + [("slrs", preset("sd", draft_len=4, vocab="slrs"))])
    assert spm.decode(ref).startswith(TEXT)
    for name in ("tli", "union", "slem", "slrs"):
        assert acc[name][0] >= 12, acc
    assert acc["slem-tree"][0] >= 12 and acc["tli-tree"][0] >= 8, acc


def test_byte_level_bpe_drafter_on_a_sentencepiece_target_every_bridge_is_plain_greedy(spm, spm_target, root):
    """(b) a llama drafter with a byte-level (GPT-2 style) BPE that continues the history it sees
    (the target's bytes re-encoded in its own tokens)."""
    model, prompt, chain = spm_target
    d = trained_bpe(1200, "bytelevel")
    text = b"".join(spm.token_bytes(i) for i in chain).decode()
    dchain = d.encode(text)
    rows: dict[int, dict[int, float]] = {}
    for a, b in zip(dchain, dchain[1:]):
        rows.setdefault(a, {b: 8.0})
    # where the target's history ends inside a drafter token, the drafter's last token goes on too
    at = 0
    for tok in chain[:-1]:
        at += len(spm.token_bytes(tok))
        cut = text.encode()[:at].decode(errors="ignore")
        rest = d.encode(text[len(cut):])
        if rest:
            rows.setdefault(d.encode(cut)[-1], {rest[0]: 8.0})
    drafter = load(str(bigram_model(root / "spm-bpe-drafter", "llama", d.vocab_size, rows, {dchain[1]: 8.0}, base=0.0))).model
    dec = Decoder(model, drafter, target_tokenizer=spm, drafter_tokenizer=d)
    assert dec.bridged
    _, acc = _check_greedy(dec, prompt, BRIDGES)
    assert acc["slem"][0] >= 8 and acc["tli"][0] >= 4, acc


def test_sentencepiece_drafter_on_a_byte_level_target_every_bridge_is_plain_greedy(spm, root):
    """The other way round: the drafter's tokenizer is the sentencepiece one (its "▁", prefix and
    byte pieces become bytes on the way to a byte-level BPE target)."""
    t = trained_bpe(1200, "bytelevel")
    text = "Hello world, the quick €1\n"
    prompt = t.encode("Hi:")
    full = t.encode("Hi:" + text * 3)
    chain = full[len(prompt) - 1:]
    rows: dict[int, dict[int, float]] = {}
    for a, b in zip(chain, chain[1:]):
        rows.setdefault(a, {b: 8.0})
    target = load(str(bigram_model(root / "bpe-target", "llama", t.vocab_size, rows, {chain[1]: 8.0}, base=0.0))).model
    drafter = load(str(bigram_model(root / "spm-drafter", "llama", spm.vocab_size, {}, {spm.token_to_id("▁the"): 8.0},
                                    base=0.0))).model
    dec = Decoder(target, drafter, target_tokenizer=t, drafter_tokenizer=spm)
    assert dec.bridged
    _check_greedy(dec, prompt, BRIDGES)
