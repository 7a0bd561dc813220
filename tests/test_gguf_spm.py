"""GGUF files with a sentencepiece tokenizer (``tokenizer.ggml.model == "llama"``: Llama 2,
Mistral 7B, TinyLlama, Vicuna...), rebuilt by engine/tokenizer.py from the pieces, their scores and
their types.

References: a plain-Python copy of llama.cpp's algorithm (``llm_tokenizer_spm``: join the adjacent
pair whose joined piece scores best, leftmost first; pieces left unknown become ``<0xNN>`` bytes;
a space before the text at the start and after each special token), and a ``tokenizers`` backend
laid out as Llama-2's / Mistral's own ``tokenizer.json`` with merges from transformers'
``generate_merges``. (Checked once by hand, outside the suite: the same code against real
SentencePiece models trained with byte fallback, 620 texts each, identical ids and text.)
"""

from __future__ import annotations

import heapq
import random

import pytest
import torch

from engine.errors import ModelLoadError
from engine.tokenizer import StreamDecoder, Tokenizer
from .test_tokenizer import _stream

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
SPACE = "\u2581"

# Multi-character pieces in merge priority (sentencepiece's BPE order: best first), as a
# trained model lists them after its specials and bytes; then the single characters.
MERGED = ("▁t he ▁a in er ▁the on re ▁s an ▁w or en at ▁o nd ▁▁ is it ▁c es ▁b ou ▁h ed ▁f ing ▁m ll "
          "▁to ▁p ar ▁d le ▁of ▁and ▁in ▁th ▁he llo ▁hello ld ▁wor ▁world ▁▁▁▁ ▁1 12 ▁I IN ST INST ▁is "
          "as ic ▁H ▁He el ▁Hel ▁Hello ▁you ▁y ou. ▁▁▁ ing. ▁W ▁Wh at? ▁What ▁it 00 000 ▁é té ▁été 中文 ▁中 ▁中文 "
          "lo ▁lo ▁low ▁lower ▁n ▁new ▁ne ew est ▁newest yz").split()
CHARS = list("▁etaoinshrdlcumwfgypbvkjxqzTHEAIWSN0123456789.,!?'-:;()\"[]/<>é中文")
# Pieces whose scores go against their order in the file: "xy" comes first but scores worse
# than "yz", so "xyz" is "x" + "yz" (ranking merges by id would give "xy" + "z").
LATE = [("xy", -1000.0)]
SPECIALS = [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL), ("[INST]", CONTROL), ("[/INST]", CONTROL),
            ("<tool>", USER_DEFINED)]


def spm_vocab() -> tuple[list[str], list[int], list[float]]:
    """(tokens, token types, scores): specials, the 256 ``<0xNN>`` byte pieces, merged pieces with
    falling scores, single characters (lower still), as a llama.cpp conversion of a trained model."""
    tokens = [t for t, _ in SPECIALS] + [f"<0x{b:02X}>" for b in range(256)]
    types = [ty for _, ty in SPECIALS] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    for t, s in LATE:
        tokens.append(t), types.append(NORMAL), scores.append(s)
    seen = set(tokens)
    for rank, t in enumerate(dict.fromkeys(MERGED + CHARS)):
        if t not in seen:
            tokens.append(t), types.append(NORMAL), scores.append(-float(rank))
    vocab = set(tokens)
    for t in tokens[len(SPECIALS) + 256:]:  # every multi-char piece can be built from two others
        assert len(t) == 1 or any(t[:k] in vocab and t[k:] in vocab for k in range(1, len(t))), t
    return tokens, types, scores


def metadata(tokens, types, scores, **extra) -> dict:
    md = {"general.architecture": "llama", "general.name": "tiny-spm", "tokenizer.ggml.model": "llama",
          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": scores,
          "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}
    md.update(extra)
    return md


def llama_cpp_encode(text: str, tokens, types, scores, add_space_prefix: bool = True) -> list[int]:
    """llama.cpp's sentencepiece tokenisation (llama-vocab.cpp: tokenizer_st_partition, then
    llm_tokenizer_spm_session::tokenize and resegment for each stretch of text), specials parsed."""
    vocab = {t: i for i, t in enumerate(tokens)}
    frags: list[tuple[str, object]] = [("raw", text)] if text else []
    for sp in sorted((t for t, ty in zip(tokens, types) if ty in (UNKNOWN, CONTROL, USER_DEFINED)), key=len, reverse=True):
        out = []
        for kind, x in frags:
            if kind != "raw":
                out.append((kind, x))
                continue
            for j, part in enumerate(x.split(sp)):
                if j:
                    out.append(("tok", vocab[sp]))
                if part:
                    out.append(("raw", part))
        frags = out
    ids: list[int] = []
    prev_special = True
    for kind, x in frags:
        if kind == "tok":
            ids.append(x)
            prev_special = True
            continue
        if add_space_prefix and prev_special:
            x = " " + x
        prev_special = False
        sym = list(x.replace(" ", SPACE))
        nxt = list(range(1, len(sym))) + [-1]
        prv = list(range(-1, len(sym) - 1))
        queue: list = []

        def bigram(left: int, right: int) -> None:
            if left >= 0 and right >= 0 and (tid := vocab.get(sym[left] + sym[right])) is not None:
                heapq.heappush(queue, (-scores[tid], left, right, len(sym[left]) + len(sym[right])))

        for i in range(1, len(sym)):
            bigram(i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
                continue  # outdated
            sym[left], sym[right] = sym[left] + sym[right], ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            bigram(prv[left], left)
            bigram(left, nxt[left])
        for s in sym:
            if s:
                ids += [vocab[s]] if s in vocab else [vocab[f"<0x{b:02X}>"] for b in s.encode("utf-8")]
    return ids


def hf_layout_reference(tokens, types, scores):
    """A ``tokenizers`` backend as in Llama-2's / Mistral's tokenizer.json (BPE with byte fallback,
    Prepend + Replace normaliser, Replace/ByteFallback/Fuse/Strip decoder, specials added with
    normalized=False), merges from transformers' own recovery from scores."""
    from tokenizers import AddedToken, decoders, models, normalizers
    from tokenizers import Tokenizer as Backend
    from transformers.tokenization_utils_base import generate_merges

    vocab = {t: i for i, t in enumerate(tokens)}
    ref = Backend(models.BPE(vocab=vocab, merges=generate_merges(vocab, dict(zip(tokens, scores))),
                             byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    ref.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    ref.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    ref.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty in (UNKNOWN, CONTROL)])
    ref.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED])
    return ref


TRICKY = ["", " ", "  ", "   ", "\n", "Hello", " Hello", "Hello ", "Hello world", "hello  world", "  two  spaces  ",
          "the end\n", "a\nb\n\nc", "\tindented\n    code", "12 120 1200 12000", "été", "中文 ▁中文", "ü",
          "naïve café", "€100", "emoji 😀🎉 ok", "😀", "x\u0301", "xyz", "the newest lower", "What? It is.",
          "[INST] Hello [/INST]", "<s>[INST] What is it? [/INST]Hello</s>", "[INST][/INST]", "a[INST]b",
          "<tool>use <tool>", "<unk>", "[INST", "INST]", "<s ></s>", "\u2581 literal", "ÿ\x00\x7f"]


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = CHARS + list(" \n\t😀€üÿ") + ["the ", "hello ", "world", " [INST] ", "</s>", "<tool>", "new", "xyz"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(n)]


@pytest.fixture(scope="module")
def spm():
    tokens, types, scores = spm_vocab()
    return tokens, types, scores, Tokenizer.from_gguf(metadata(tokens, types, scores))


def test_encode_matches_llama_cpp_and_the_hf_layout(spm):
    tokens, types, scores, tok = spm
    ref = hf_layout_reference(tokens, types, scores)
    assert 300 < len(tokens) < 500 and tok.vocab_size == len(tokens)
    for text in TRICKY + random_texts(400):
        ids = tok.encode(text)
        assert ids == llama_cpp_encode(text, tokens, types, scores), text
        assert ids == ref.encode(text, add_special_tokens=False).ids, text
        for skip in (False, True):
            assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), text
        if SPACE not in text and not any(s in text for s, _ in SPECIALS):
            assert tok.decode(ids) == text  # round trip, leading spaces included


def test_pieces_merge_by_score_with_byte_fallback(spm):
    tokens, _, _, tok = spm

    def pieces(text):
        return [tok.id_to_token(i) for i in tok.encode(text)]

    assert pieces("the") == ["▁the"] and pieces("Hello world") == ["▁Hello", "▁world"]
    assert pieces("xyz") == ["▁", "x", "yz"]  # "yz" scores better than "xy", listed first
    assert pieces("  hi") == ["▁▁", "▁h", "i"]  # the prefix comes on top of the text's own spaces
    assert pieces("€1") == ["▁", "<0xE2>", "<0x82>", "<0xAC>", "1"]  # no "€" piece: its UTF-8 bytes
    assert pieces("a\nb") == ["▁a", "<0x0A>", "b"]
    assert tok.encode("") == [] and tok.encode("", add_special_tokens=True) == [1]
    assert tok.encode("the", add_special_tokens=True) == [1, tokens.index("▁the")]  # add_bos defaults to true
    assert tok.decode(tok.encode("€1 😀")) == "€1 😀"
    assert [tok.token_bytes(tokens.index(t)) for t in ("▁the", "<0xE2>", "▁▁", "中文")] == [b" the", b"\xe2", b"  ", "中文".encode()]
    assert tok.token_str(tokens.index("<0xE2>")) == "\\xe2" and tok.token_str(tokens.index("▁Hello")) == " Hello"


def test_special_tokens(spm):
    tokens, _, _, tok = spm
    bos, eos, inst, einst, tool = (tokens.index(t) for t in ("<s>", "</s>", "[INST]", "[/INST]", "<tool>"))
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.eos_ids) == (1, 2, 0, {2})
    ids = tok.encode("<s>[INST] Hi [/INST]Hello</s>")
    assert ids[:2] == [bos, inst] and einst in ids and ids[-1] == eos
    # after each special token the text gets its own "▁" prefix (llama.cpp, Llama-2's tokenizer.json)
    assert [tok.id_to_token(i) for i in ids[ids.index(einst) + 1:-1]] == ["▁Hello"]
    assert tok.decode(ids, skip_special_tokens=True) == " Hi  Hello"  # "▁▁Hi▁" "▁Hello", one space stripped
    assert tok.decode(ids) == "<s>[INST]  Hi [/INST] Hello</s>"
    assert all(tok.is_special(i) for i in (0, bos, eos, inst, einst)) and not tok.is_special(tool)
    assert tok.encode("<tool>") == [tool] and tok.decode([tool], skip_special_tokens=True) == "<tool>"
    assert tok.token_bytes(inst) == b"[INST]" and tok.token_str(eos) == "</s>"
    assert tok.template_variables() == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def test_flags_and_defaults():
    tokens, types, scores = spm_vocab()
    tok = Tokenizer.from_gguf(metadata(tokens, types, scores, **{"tokenizer.ggml.add_space_prefix": False,
                                                                 "tokenizer.ggml.add_bos_token": False,
                                                                 "tokenizer.ggml.add_eos_token": True}))
    ids = tok.encode("the world", add_special_tokens=True)
    assert [tok.id_to_token(i) for i in ids] == ["t", "he", "▁world", "</s>"]
    assert ids[:-1] == llama_cpp_encode("the world", tokens, types, scores, add_space_prefix=False)
    assert tok.decode(tok.encode(" lead")) == " lead"  # no prefix added, so no space stripped
    # no ids and no types in the file: llama.cpp's defaults (bos 1, eos 2, unk 0), still special
    md = metadata(tokens, types, scores)
    for k in ("tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
              "tokenizer.ggml.unknown_token_id"):
        del md[k]
    bare = Tokenizer.from_gguf(md)
    assert (bare.bos_id, bare.eos_id, bare.unk_id) == (1, 2, 0) and bare.encode("<s>x</s>")[::3] == [1, 2]
    assert bare.is_special(1) and bare.decode(bare.encode("€ the")) == "€ the"


def test_saved_tokenizer_json_loads_back(spm, tmp_path):
    """``save`` writes the rebuilt tokenizer as a tokenizer.json directory (drafter export): it
    loads back with the same ids, add_bos and specials."""
    *_, tok = spm
    back = Tokenizer.from_hf_dir(tok.save(tmp_path / "tok"))
    assert (back.bos_id, back.eos_id, back.add_bos) == (1, 2, True)
    for text in TRICKY + random_texts(50, seed=3):
        assert back.encode(text, add_special_tokens=True) == tok.encode(text, add_special_tokens=True), text
        assert back.decode(tok.encode(text), skip_special_tokens=True) == tok.decode(tok.encode(text), skip_special_tokens=True)


def test_refusals():
    tokens, types, scores = spm_vocab()
    md = metadata(tokens, types, scores)
    del md["tokenizer.ggml.scores"]
    with pytest.raises(ModelLoadError, match=r"sentencepiece \(llama\) is not supported without tokenizer\.ggml\.scores"):
        Tokenizer.from_gguf(md)
    with pytest.raises(ModelLoadError, match="tokenizer.ggml.scores is not a list of one number per token"):
        Tokenizer.from_gguf(metadata(tokens, types, scores[:-1]))
    with pytest.raises(ModelLoadError, match="token_type does not have one entry per token"):
        Tokenizer.from_gguf(metadata(tokens, types[:-1], scores))
    for kind, what in (("t5", "unigram (t5)"), ("bert", "WordPiece (bert)"), ("rwkv", "'rwkv'")):
        with pytest.raises(ModelLoadError, match=rf"tokenizer model {what.replace('(', '.').replace(')', '.')} is not supported"):
            Tokenizer.from_gguf({**md, "tokenizer.ggml.model": kind})


def test_transformers_gguf_loader_agrees_on_plain_text(spm):
    """transformers' GGUF tokenizer (the same merges from scores) agrees wherever the text neither
    starts with a space nor holds a special token; there its Metaspace(prepend_scheme="first")
    adds the prefix only at the very start and not on top of a leading space (unlike llama.cpp,
    sentencepiece and Llama-2's own tokenizer.json, which we follow)."""
    pytest.importorskip("transformers")
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    tokens, types, scores, tok = spm
    theirs, _ = convert_gguf_tokenizer("llama", {"tokenizer_type": "llama", "tokens": tokens, "scores": scores,
                                                 "token_type": types})
    plain = [t for t in TRICKY + random_texts(200, seed=1)
             if not t.startswith((" ", SPACE)) and not any(s in t for s, _ in SPECIALS)]
    assert len(plain) > 100
    for text in plain:
        ids = tok.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False).ids, text
        assert tok.decode(ids) == theirs.decode(ids)
    assert [tok.id_to_token(i) for i in tok.encode("[INST] Hi")][1] == "▁▁"  # llama.cpp: "▁▁", "H", "i"
    assert theirs.encode("[INST] Hi").tokens == ["[INST]", "▁H", "i"]


def test_stream_decoding(spm):
    tokens, _, _, tok = spm
    rng = random.Random(5)
    texts = TRICKY + random_texts(60, seed=2)
    for text in texts:
        ids = tok.encode(text, add_special_tokens=True)
        for skip in (False, True):
            chunks = _stream(tok, ids, rng, skip)
            assert "".join(chunks) == tok.decode(ids, skip_special_tokens=skip), text
            assert all("\ufffd" not in c for c in chunks), text  # a split character is held, never shown half
        if text and SPACE not in text and not any(s in text for s, _ in SPECIALS):  # the text's bytes, with the prefix
            assert b"".join(tok.token_bytes(i) for i in ids[1:]) == b" " + text.encode()
    # a reply streamed alone: its first piece's prefix space is dropped, as in a full decode
    reply = tok.encode("Hello world 😀")
    assert _stream(tok, reply, rng)[0].startswith("H") and "".join(_stream(tok, reply, rng)) == "Hello world 😀"


MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")


def test_llama_gguf_with_spm_tokenizer_loads_and_chats(make_tiny_gguf):
    """A llama-architecture GGUF with a sentencepiece vocabulary, through engine.loading.load: its
    tokenizer, Mistral-Instruct's chat template, a few greedy tokens streamed back to text."""
    import jinja2

    from engine.loading import load

    tokens, types, scores = spm_vocab()
    path, _, cfg = make_tiny_gguf("llama", tokenizer_model="llama", pre="default", vocab=(tokens, types, scores),
                                  chat_template=MISTRAL_TEMPLATE)
    loaded = load(str(path))
    tok, model = loaded.tokenizer, loaded.model
    assert cfg["vocab_size"] == len(tokens) == tok.vocab_size == model.vocab_size
    assert (tok.bos_id, tok.eos_id, tok.eos_ids, tok.add_bos) == (1, 2, {2}, True)

    msgs = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "What?"},
            {"role": "user", "content": "the world"}]
    prompt = tok.apply_chat_template(msgs)
    assert prompt == "<s>[INST] Hello [/INST]What?</s>[INST] the world [/INST]"
    ids = tok.encode(prompt)  # the template writes <s>: no second one
    assert ids == llama_cpp_encode(prompt, tokens, types, scores)
    assert [tok.id_to_token(i) for i in ids[:5]] == ["<s>", "[INST]", "▁▁", "H", "e"]
    assert ids.count(1) == 1 and ids.count(2) == 1 and ids[-1] == tokens.index("[/INST]")
    with pytest.raises(jinja2.exceptions.TemplateError, match="roles must alternate"):
        tok.apply_chat_template(msgs[1:])

    # greedy over all but the <0xNN> pieces, so that the reply is valid UTF-8: a run of byte pieces
    # that is not is where streaming may differ from a full decode (StreamDecoder's docstring)
    allowed = torch.tensor([ty != BYTE for ty in types])
    model.allocate()
    model.prefill(ids[:-1])
    out, last = [], ids[-1]
    dec, streamed = StreamDecoder(tok, skip_special_tokens=True), []
    with torch.inference_mode():
        for _ in range(12):
            logits = model.extend([last], [-1])
            model.commit([0])
            last = int(logits[-1].masked_fill(~allowed, float("-inf")).argmax())
            assert 0 <= last < len(tokens)
            out.append(last)
            streamed.append(dec.push([last]))
    streamed.append(dec.flush())
    assert "".join(streamed) == tok.decode(out, skip_special_tokens=True) and len(set(out)) > 1
