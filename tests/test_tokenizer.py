"""engine.tokenizer: GGUF/HF/byte tokenizers, chat templates, streaming detokenisation.

Oracle: transformers' tokenizer built from the same GGUF. One known difference: for
``tokenizer.ggml.pre == "smollm"`` transformers splits text with the GPT-2 regex only, while
llama.cpp and SmolLM2's own tokenizer.json first isolate every digit. They disagree only where a
run of 2+ whitespace characters precedes a digit ("a  1"); there the oracle is transformers'
vocabulary with the original pre-tokenizer put back.
"""

from __future__ import annotations

import json
import random

import pytest

from engine.errors import ModelLoadError
from engine.tokenizer import ByteTokenizer, StreamDecoder, Tokenizer

STRINGS = [
    "Hello, world!",
    "def f(x):\n    return x**2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "12345.678",
    "pi is 3.14159, e is 2.71828 and 1e-9 is small",
    "  leading spaces",
    "trailing   ",
    "   \t  mixed   whitespace\n  \n",
    "\n\n\n",
    " ",
    "",
    "中文测试：你好世界",
    "日本語のテキスト",
    "한국어 문장",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧",
    "Ünïcödé àccents, naïve café résumé",
    "Ωμέγα ελληνικά / привет мир / مرحبا",
    "ＦＵＬＬ　ｗｉｄｔｈ",
    "<|im_start|>user\nHi<|im_end|>\n",
    "a<|im_end|>b<|endoftext|>",
    "<repo_name>specchat<file_sep>",
    "tabs\tand\nnewlines\r\n",
    "don't won't I'm we'll they've",
    "$100 + €50 = ¥?",
    "https://example.com/path?q=1&r=2#frag",
    "x = [1, 2, 3]; y = {'a': 1}",
    "SELECT * FROM users WHERE id = 42;",
    "The quick brown fox jumps over the lazy dog.",
    "<div class=\"x\">&nbsp;</div>",
    "∑_{i=1}^{n} i² = n(n+1)(2n+1)/6",
]
# whitespace runs before digits: where transformers' smollm pre-tokenizer is wrong
DIGIT_SPACING = ["a  1", "x\t\t42", "12  34", "version 3.14  2 items", "col1   col2\n  3"]


@pytest.fixture(scope="module")
def ours(smollm2_gguf_path):
    return Tokenizer.from_gguf(smollm2_gguf_path)


@pytest.fixture(scope="module")
def hf(smollm2_gguf_path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf_path.parent), gguf_file=smollm2_gguf_path.name)


# ---------------------------------------------------------------------------------------------
# SmolLM2 GGUF against transformers
# ---------------------------------------------------------------------------------------------
def test_metadata(ours):
    assert ours.vocab_size == 49152
    assert ours.bos_id == 1 and ours.eos_id == 2 and ours.eos_ids == {2}
    assert not ours.add_bos
    assert ours.chat_template and "<|im_start|>" in ours.chat_template
    assert ours.is_special(1) and not ours.is_special(905)
    assert ours.token_str(905) == " world" and ours.id_to_token(905) == "Ġworld"
    assert ours.token_str(1) == "<|im_start|>"


@pytest.mark.parametrize("text", STRINGS)
def test_ids_equal_transformers(ours, hf, text):
    ids = ours.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False)
    assert ours.encode(text, add_special_tokens=True) == hf.encode(text)  # no BOS for SmolLM2
    assert ours.decode(ids) == text == hf.decode(ids)
    assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


def test_special_tokens_matched_whole(ours):
    assert ours.encode("<|im_start|>") == [1]
    assert ours.encode("<|im_end|>") == [2]
    assert ours.encode("x<|im_start|>y")[1] == 1


@pytest.mark.parametrize("text", STRINGS + DIGIT_SPACING)
def test_ids_equal_original_smollm_pretokenizer(ours, hf, text):
    """SmolLM2's tokenizer.json: Digits(individual) then ByteLevel — rebuilt on transformers' vocab."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import pre_tokenizers

    original = Backend.from_str(hf.backend_tokenizer.to_str())
    original.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    assert ours.encode(text) == original.encode(text, add_special_tokens=False).ids
    assert ours.decode(ours.encode(text)) == text


def test_digits_split_singly(ours):
    ids = ours.encode("a  1")
    assert [ours.token_str(i) for i in ids] == ["a", "  ", "1"]  # llama.cpp and the original agree


def test_chat_template_equals_transformers(ours, hf):
    chats = [
        [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
         {"role": "user", "content": "And 3+3? 😀"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."},
         {"role": "assistant", "content": "Blue."}],
    ]
    for msgs in chats:
        for gen in (True, False):
            mine = ours.apply_chat_template(msgs, add_generation_prompt=gen)
            theirs = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            assert mine == theirs
            assert ours.encode(mine) == hf.encode(theirs, add_special_tokens=False)
    assert mine.count("<|im_start|>") == 3 and "You are a helpful AI assistant" not in mine


def test_save_then_from_hf_dir(ours, hf, tmp_path):
    ours.save(tmp_path)
    back = Tokenizer.from_hf_dir(tmp_path)
    assert (back.bos_id, back.eos_id, back.eos_ids, back.pad_id) == (ours.bos_id, ours.eos_id, ours.eos_ids, ours.pad_id)
    assert back.chat_template == ours.chat_template and back.vocab_size == ours.vocab_size
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text in STRINGS + DIGIT_SPACING:
        assert back.encode(text) == ours.encode(text) == theirs.encode(text, add_special_tokens=False)


def test_from_gguf_reader_and_dict(smollm2_gguf_path, ours):
    from engine.gguf import read_gguf

    with read_gguf(smollm2_gguf_path) as f:
        via_file = Tokenizer.from_gguf(f)
        via_dict = Tokenizer.from_gguf(dict(f.metadata))
    for t in (via_file, via_dict):
        assert t.encode(STRINGS[14]) == ours.encode(STRINGS[14])


# ---------------------------------------------------------------------------------------------
# Tiny GGUF tokenizers (pre-tokenizer variants, errors)
# ---------------------------------------------------------------------------------------------
def test_tiny_gguf_tokenizer(make_tiny_gguf):
    import gguf

    path, _, _ = make_tiny_gguf("llama")
    tok = Tokenizer.from_gguf(path)
    assert [tok.token_str(i) for i in tok.encode("the the")] == ["t", "he", " the"]
    assert tok.encode("<think>") == [tok.token_to_id("<think>")]
    assert not tok.is_special(tok.token_to_id("<think>")) and tok.is_special(1)
    # gpt2 merges cannot build "xyz": it stays three tokens unless merges are ignored
    assert len(tok.encode("xyz")) == 3
    assert tok.encode("xyz") == Tokenizer.from_gguf(gguf.GGUFReader(str(path))).encode("xyz")


def test_llama_bpe_ignores_merges_and_adds_bos(make_tiny_gguf):
    path, _, _ = make_tiny_gguf("llama", pre="llama-bpe")
    tok = Tokenizer.from_gguf(path)
    assert tok.encode("xyz") == [tok.token_to_id("xyz")]
    assert tok.add_bos and tok.encode("xyz", add_special_tokens=True) == [1, tok.token_to_id("xyz")]
    path, _, _ = make_tiny_gguf("llama", pre="llama-bpe", name="nobos.gguf",
                                extra_kv={"tokenizer.ggml.add_bos_token": False})
    assert Tokenizer.from_gguf(path).encode("xyz", add_special_tokens=True) == [Tokenizer.from_gguf(path).token_to_id("xyz")]


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "tekken"])
def test_split_regex_matches_transformers(make_tiny_gguf, pre):
    """The regexes agree with transformers' GGUF loader, which takes them from the model families'
    tokenizer classes (pre-tokenisation compared piece by piece)."""
    transformers = pytest.importorskip("transformers")
    path, _, _ = make_tiny_gguf("llama", pre=pre)
    ours = Tokenizer.from_gguf(path).backend.pre_tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).backend_tokenizer.pre_tokenizer
    for text in STRINGS + DIGIT_SPACING:
        assert ours.pre_tokenize_str(text) == theirs.pre_tokenize_str(text), text


@pytest.mark.parametrize("pre", ["gpt-2", "smollm", "llama-bpe", "qwen2", "default", "tekken", "dbrx"])
def test_pretokenizers_round_trip(make_tiny_gguf, pre):
    path, _, _ = make_tiny_gguf("llama", pre=pre)
    tok = Tokenizer.from_gguf(path)
    for text in STRINGS + DIGIT_SPACING:
        ids = tok.encode(text)
        if pre in ("qwen2",):  # NFC-normalised, as Qwen2's tokenizer.json
            import unicodedata

            text = unicodedata.normalize("NFC", text)
        assert tok.decode(ids) == text


def test_unknown_pretokenizer(make_tiny_gguf):
    path, _, _ = make_tiny_gguf("llama", pre="brand-new")
    with pytest.raises(ModelLoadError, match="pre-tokenizer 'brand-new' is not supported") as e:
        Tokenizer.from_gguf(path)
    assert str(path) in str(e.value)


def test_end_of_turn_tokens_join_eos(make_tiny_gguf):
    tmpl = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|endoftext|>{% endfor %}"
    path, _, _ = make_tiny_gguf("llama", chat_template=tmpl)
    tok = Tokenizer.from_gguf(path)
    assert tok.eos_ids == {2, 0}  # eos (<|im_end|>) + <|endoftext|>, which the template uses


# ---------------------------------------------------------------------------------------------
# HF directories
# ---------------------------------------------------------------------------------------------
def test_from_hf_dir_reads_configs(tmp_path):
    ByteTokenizer().save(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["add_bos_token"] = True
    cfg["chat_template"] = "ignored: chat_template.jinja wins"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [257, 10]}))
    tok = Tokenizer.from_hf_dir(tmp_path)
    assert tok.encode("hi", add_special_tokens=True) == [256, 104, 105]
    assert tok.eos_id == 257 and tok.eos_ids == {257, 10}
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "[user] x\n"


def test_from_hf_dir_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot parse tokenizer") as e:
        Tokenizer.from_hf_dir(tmp_path)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------
# Chat templates: fallback and sandbox
# ---------------------------------------------------------------------------------------------
def test_fallback_chat_format():
    tok = ByteTokenizer()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(msgs) == "System: Be brief.\nUser: Hi\nAssistant:"
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == "System: Be brief.\nUser: Hi"


def test_template_globals_and_sandbox():
    import jinja2

    tok = ByteTokenizer(chat_template="{{ bos_token }}{{ messages[0].content | tojson }}{% if extra %}{{ strftime_now('%Y') | length }}{% endif %}")
    assert tok.apply_chat_template([{"role": "user", "content": "é\"<"}], extra=True) == '<|bos|>"é\\"<"4'
    with pytest.raises(jinja2.exceptions.TemplateError, match="no system"):
        ByteTokenizer(chat_template="{{ raise_exception('no system') }}").apply_chat_template([])
    with pytest.raises(jinja2.exceptions.SecurityError):
        ByteTokenizer(chat_template="{{ messages.__class__.__mro__[1].__subclasses__() }}").apply_chat_template([])
    with pytest.raises(jinja2.exceptions.SecurityError):  # immutable: templates cannot mutate inputs
        ByteTokenizer(chat_template="{{ messages.append(1) }}").apply_chat_template([])
    gen = ByteTokenizer(chat_template="{% generation %}{{ messages[0].content }}{% endgeneration %}")
    assert gen.apply_chat_template([{"role": "assistant", "content": "ok"}]) == "ok"
    with pytest.raises(ModelLoadError, match="chat template does not compile"):
        ByteTokenizer(chat_template="{% if %}").apply_chat_template([])


# ---------------------------------------------------------------------------------------------
# StreamDecoder
# ---------------------------------------------------------------------------------------------
def _stream(tok, ids, rng, skip=False):
    dec = StreamDecoder(tok, skip_special_tokens=skip)
    chunks, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 4)
        chunks.append(dec.push(ids[i:i + n]))
        i += n
        empty = sum(1 for j in dec._ids if not dec._bytes(j))  # skipped specials held inside a character
        assert len(dec._ids) <= StreamDecoder.CONTEXT + 6 + empty, "the decode window must stay small"
    chunks.append(dec.flush())
    return chunks


def test_stream_decoder_smollm2(ours):
    rng = random.Random(0)
    texts = ["emoji 😀🎉👍🏽 family 👨‍👩‍👧 中文测试：你好世界", "naïve café 日本語のテキスト 한국어 🦀🦀",
             "<|im_start|>assistant\n答案是 42 😀<|im_end|>"]
    multibyte = [i for i in range(ours.vocab_size) if any(b >= 0x80 for b in ours.token_bytes(i))]
    sequences = [ours.encode(t) for t in texts]
    sequences += [[rng.choice(multibyte) for _ in range(rng.randint(1, 40))] for _ in range(150)]
    sequences += [[rng.randrange(ours.vocab_size) for _ in range(rng.randint(1, 40))] for _ in range(100)]
    split = 0
    for ids in sequences:
        for skip in (False, True):
            full = ours.decode(ids, skip_special_tokens=skip)
            chunks = _stream(ours, ids, rng, skip)
            assert "".join(chunks) == full
            if "\ufffd" not in full:
                assert not any("\ufffd" in c for c in chunks)
            split += "\ufffd" in ours.decode(ids[:1])
    assert split > 0  # some sequences do start with half a character


def test_stream_decoder_holds_partial_characters():
    tok = ByteTokenizer()
    dec = StreamDecoder(tok)
    out = [dec.push([b]) for b in "a中😀".encode()]
    assert out == ["a", "", "", "中", "", "", "", "😀"]
    assert dec.push([0xE4]) == "" and dec.flush() == "\ufffd"  # an unfinished character at the end
    assert dec.push([0xFF, 0x41]) == "\ufffdA"  # invalid bytes never wait


def test_stream_decoder_random_bytes_match_full_decode():
    """Random (often invalid) UTF-8: the U+FFFD placement must equal the full decode's."""
    tok = ByteTokenizer()
    rng = random.Random(1)
    pool = list(range(256)) + [0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80] * 20 + [256, 257]
    for _ in range(300):
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 30))]
        for skip in (False, True):
            assert "".join(_stream(tok, ids, rng, skip)) == tok.decode(ids, skip_special_tokens=skip)


def test_stream_decoder_long_stream_is_linear():
    tok = ByteTokenizer()
    dec = StreamDecoder(tok)
    text = "héllo wörld 😀 中文 " * 2000
    out = "".join(dec.push([b]) for b in text.encode()) + dec.flush()
    assert out == text


# ---------------------------------------------------------------------------------------------
# ByteTokenizer
# ---------------------------------------------------------------------------------------------
def test_byte_tokenizer_round_trips(tmp_path):
    tok = ByteTokenizer()
    rng = random.Random(2)
    alphabet = "abc xyz\n\t éü中文😀👍🏽\u200d\x00\x7f"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 50)))
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8"))
        assert tok.decode(ids) == text
    for _ in range(100):
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(0, 30)))
        assert tok.decode(list(raw)) == raw.decode("utf-8", errors="replace")
        assert b"".join(tok.token_bytes(b) for b in raw) == raw
    assert tok.vocab_size == 259 and (tok.bos_id, tok.eos_id, tok.pad_id) == (256, 257, 258)
    assert tok.encode("hi<|eos|>") == [104, 105, 257]
    assert tok.decode([104, 257], skip_special_tokens=True) == "h"
    assert tok.token_str(0xE4) == "\\xe4" and tok.token_str(257) == "<|eos|>"

    tok.save(tmp_path)
    back = Tokenizer.from_hf_dir(tmp_path)
    assert back.encode("héllo 😀") == tok.encode("héllo 😀") and back.eos_ids == {257}
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert theirs.encode("héllo 😀", add_special_tokens=False) == tok.encode("héllo 😀")


def _sentencepiece_style() -> Tokenizer:
    """A tiny Llama-2-style tokenizer.json: Metaspace, byte fallback, decoder that strips the
    first leading space. Streaming must keep that space logic and the <0xNN> byte pieces right."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers
    from tokenizers import AddedToken

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    words = ["hello", "world"]
    pieces = ["\u2581"] + sorted(set("helowrd")) + ["中"]
    merges = []
    for w in words:
        cur = "\u2581"
        for ch in w:
            merges.append((cur, ch))
            cur += ch
            pieces.append(cur)
    for p in pieces:
        vocab.setdefault(p, len(vocab))
    backend = Backend(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return Tokenizer(backend, bos_id=1, eos_id=2)


def test_stream_decoder_sentencepiece_style():
    tok = _sentencepiece_style()
    ids = tok.encode("hello world 中😀 hello wörld")
    assert [tok.token_str(i) for i in ids[:3]] == [" hello", " world", " "]
    assert "<0xF0>" in [tok.id_to_token(i) for i in ids] and tok.token_bytes(tok.token_to_id("<0xF0>")) == b"\xf0"
    rng = random.Random(3)
    pieces = [i for i in range(tok.vocab_size) if not tok.id_to_token(i).startswith("<0x")]
    mixed = [rng.choice(pieces) if rng.random() < 0.5 else tok.encode(rng.choice("中😀é"))[-1] for _ in range(40)]
    # (random <0xNN> runs are left out: for invalid UTF-8, ByteFallback writes one U+FFFD per byte
    # of the whole run, which no streaming decoder can know before the run ends.)
    for seq in (ids, [1] + ids + [2], ids[3:], ids[5:], [rng.choice(pieces) for _ in range(40)], mixed):
        for skip in (False, True):
            for _ in range(5):
                chunks = _stream(tok, seq, rng, skip)
                assert "".join(chunks) == tok.decode(seq, skip_special_tokens=skip)
    assert _stream(tok, ids, rng)[0].startswith("hello")  # the first piece's space is stripped, as in decode
