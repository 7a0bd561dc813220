"""Vocabulary bridges, session 43 review: a sentencepiece-style DRAFTER under a target of another
vocabulary saw text the target never wrote.

The bridge hands the drafter the target's history as text re-encoded with the drafter's tokenizer
(engine/drafters/vocab.py ``BridgeDrafter.drafter_history``). A sentencepiece encoder adds a "▁"
of its own in front of a text (Llama-2's ``Prepend("▁")`` normaliser, also after each special
token; ``Metaspace(prepend_scheme=...)``): the drafter's context spelled " Hi:" for the target's
"Hi:" and "<s>[INST]  Hi [/INST]  the" (two spaces each) for "<s>[INST] Hi [/INST] the". Now the
drafter's ids spell the target's text exactly, and are the drafter's own tokens for it everywhere
but the prefix.
"""

from __future__ import annotations

import pytest

from engine.drafters.vocab import BridgeDrafter, HistoryBytes
from engine.tokenizer import Tokenizer

from .test_gguf_spm import metadata, spm_vocab
from .vocab_pairs import trained_bpe

TEXTS = ["Hi:", "Hello world, the quick €1\n", " Hello  world", "<s>[INST] Hi [/INST] the", "</s>Hello",
         "[INST]Hi[/INST]Hello world"]


@pytest.fixture(scope="module")
def spm():
    """Llama-2 style (GGUF metadata): Prepend("▁") normaliser, <0xNN> byte pieces, control specials."""
    return Tokenizer.from_gguf(metadata(*spm_vocab()))


def _history_of(target: Tokenizer, drafter: Tokenizer):
    br = BridgeDrafter.__new__(BridgeDrafter)  # the history half only: no drafter model needed
    br.target_tok, br.drafter_tok = target, drafter
    br.bytes = HistoryBytes(target)
    br.byte_level = False
    return br.drafter_history


def _spelled(tok: Tokenizer, ids) -> bytes:
    return b"".join(tok.token_bytes(i) for i in ids)


def _text_ids(tok: Tokenizer, ids):  # type: ignore[no-untyped-def]
    """The ids after the BOS a Llama-style drafter's context starts with (test_a_bos_...)."""
    return ids[1:] if ids and ids[0] == tok.bos_id and tok.add_bos else ids


@pytest.mark.parametrize("drafter", ["gguf-spm", "metaspace"])
@pytest.mark.parametrize("text", TEXTS)
def test_a_sentencepiece_drafter_sees_the_targets_text_without_an_extra_leading_space(drafter, text, spm):
    """Was: ``drafter_tok.encode(text)``, whose "▁" prefix put a space in front of the drafter's
    context (and, for the GGUF layout, after each special token)."""
    target = trained_bpe(1200, "bytelevel")
    d = spm if drafter == "gguf-spm" else trained_bpe(1200, "metaspace")
    if drafter == "metaspace":
        text = text.replace("€", "")  # no byte fallback there: a character outside its alphabet is lost
    hist = target.encode(text)
    assert _spelled(target, hist) == text.encode()
    ids, held = _history_of(target, d)(hist)
    assert held == b""
    if not text.startswith("<s>"):  # (a history spelling "<s>" has the BOS as its own first token)
        ids = _text_ids(d, ids)
    assert _spelled(d, ids) == text.encode(), [d.id_to_token(i) for i in ids]
    if not text.startswith(" "):  # (a decoder strips one leading space: the prefix it assumes)
        assert d.decode(ids) == target.decode(hist) == text
    # the drafter's own tokens for the text, but for the prefix: from the second word on, identical
    words = text.split(" ")
    if len(words) > 2 and not any(s in text for s in ("<s>", "</s>", "[INST]")):
        tail = " " + " ".join(words[2:])
        assert _spelled(d, ids).endswith(tail.encode())
        own = d.encode(text)
        assert ids[-len(d.encode(tail)) + 1:] == own[-len(d.encode(tail)) + 1:]


def test_the_drafter_context_grows_by_its_tail(spm):
    """The drafter's cache keeps the common prefix of its contexts: the prefix-free encoding of a
    history is, token by token, stable as the history grows (only its last pieces change)."""
    target = trained_bpe(1200, "bytelevel")
    hist = target.encode("Hello world, the quick brown fox")
    of = _history_of(target, spm)
    prev: list[int] = []
    for k in range(1, len(hist) + 1):
        ids, _ = of(hist[:k])
        assert _spelled(spm, _text_ids(spm, ids)) == _spelled(target, hist[:k])
        common = 0
        while common < min(len(ids), len(prev)) and ids[common] == prev[common]:
            common += 1
        assert common >= len(prev) - 2, (prev, ids)
        prev = ids


def test_byte_level_drafters_are_unchanged(spm):
    """A drafter whose encoder adds nothing (byte-level BPE) see the same ids as before (their own encoding)."""
    for target in (trained_bpe(1200, "bytelevel"), spm):
        hist = target.encode("Hello world, the quick €1\n")
        data = _spelled(target, hist)
        d = trained_bpe(1000, "bytelevel", offset=400)
        ids, _ = _history_of(target, d)(hist)
        assert ids == d.encode(data.decode())


def test_encode_unprefixed_spells_the_text_itself(spm):
    """``Tokenizer.encode_unprefixed``: the ids spell the text (no "▁" the encoder adds); where the
    text starts with a space they are the encoder's own ids for the rest (" Hello" is "▁Hello", as
    ``encode("Hello")`` writes it): the same tokenization, the prefix aside."""
    from .test_gguf_spm import TRICKY, random_texts

    texts = [t for t in TRICKY + random_texts(100, seed=3) if "\u2581" not in t and not any(
        s in t for s in ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "<tool>"))]
    assert len(texts) > 50
    for text in texts:
        ids = spm.encode_unprefixed(text)
        assert _spelled(spm, ids) == text.encode(), text
        if text:  # (Prepend leaves an empty text empty)
            assert spm.encode_unprefixed(" " + text) == spm.encode(text), text
    # after a special token too (the GGUF layout prefixes each stretch of text)
    ids = spm.encode_unprefixed("<s>[INST] Hi [/INST]the")
    assert [spm.id_to_token(i) for i in ids] == ["<s>", "[INST]", "▁H", "i", "▁", "[/INST]", "t", "he"]


def test_encode_unprefixed_byte_level_prefix_space_and_plain_encoders():
    """GPT-2's ByteLevel(add_prefix_space=True) writes "Hello" as "ĠHello": not unprefixed. An
    encoder that adds nothing encodes as ``encode`` does, with its own backend (no copy)."""
    import json

    import tokenizers

    plain = trained_bpe(1200, "bytelevel")
    state = json.loads(plain.backend.to_str())
    state["pre_tokenizer"]["add_prefix_space"] = True
    spaced = Tokenizer(tokenizers.Tokenizer.from_str(json.dumps(state)), name="spaced")
    text = "Hello world, the quick"
    assert _spelled(spaced, spaced.encode(text)) == b" " + text.encode()
    assert spaced.encode_unprefixed(text) == plain.encode(text)
    assert plain.encode_unprefixed(text) == plain.encode(text) and plain._unprefixed is plain.backend


def test_a_bos_drafter_reads_the_history_after_its_bos(spm):
    """A drafter whose tokenizer starts every text with its BOS (Llama-2's "<s>") was trained on
    texts after it; the target's history, in another vocabulary, has none: the drafter's context
    starts with one (once: a history already spelling "<s>" keeps its own). A drafter without a BOS
    of its own (Metaspace BPE here, byte-level BPE) is unchanged."""
    target = trained_bpe(1200, "bytelevel")
    of = _history_of(target, spm)
    ids, _ = of(target.encode("Hello world"))
    assert ids[0] == spm.bos_id and _spelled(spm, ids[1:]) == b"Hello world"
    ids, _ = of(target.encode("<s>[INST] Hi [/INST]"))
    assert ids[0] == spm.bos_id and ids[1] != spm.bos_id
    assert of([])[0] == [spm.bos_id]
    meta = trained_bpe(1200, "metaspace")
    ids, _ = _history_of(target, meta)(target.encode("Hello world"))
    assert _spelled(meta, ids) == b"Hello world"
