"""Community GGUF files (review s41): K-quants and the other block types, tied heads, split files,
added tokens outside the byte alphabet (DeepSeek-R1-Distill-Qwen), and the stop ids of Llama 3.x
files.

Oracles: ``gguf.quants.dequantize`` and transformers' GGUF loading for weights; a ``tokenizers``
tokenizer built by hand the way the models' own ``tokenizer.json`` are (added tokens kept as their
text) for encoding; the models' generation_config.json for stop ids.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.errors import ModelLoadError
from engine.gguf import _unpermute, load_gguf
from engine.tokenizer import Tokenizer, bytes_to_unicode
from tests.conftest import tiny_vocab

# ---------------------------------------------------------------------------------------------
# Weights: every block type a community file uses, and a tied head
# ---------------------------------------------------------------------------------------------
_HF = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
       "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
       "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def _blocks(rows: int, cols: int, qt, rng) -> np.ndarray:
    """Random blocks of type ``qt`` with small fp16 scales (gguf-py cannot quantise K-quants)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

    block, size = GGML_QUANT_SIZES[qt]
    b = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    half = np.frombuffer(np.full(b.shape[:-1], 0.01, dtype=np.float16).tobytes(), np.uint8).reshape(*b.shape[:-1], 2)
    scales = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (size - 2,), T.Q3_K: (size - 2,), T.Q2_K: (size - 4, size - 2)}
    for at in scales.get(qt, (0,)):
        b[..., at:at + 2] = half
    return b.reshape(rows, -1)


def _write(path, arch: str, qt, tied: bool) -> None:
    import gguf
    from gguf.constants import GGMLQuantizationType as T

    tokens, types, merges = tiny_vocab()
    V, D, F, H, K = len(tokens), 256, 512, 4, 2
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(K)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(2)
    shapes = {"token_embd.weight": (V, D), "output_norm.weight": (D,)}
    if not tied:
        shapes["output.weight"] = (V, D)
    shapes.update({"blk.0.attn_norm.weight": (D,), "blk.0.ffn_norm.weight": (D,), "blk.0.attn_q.weight": (D, D),
                   "blk.0.attn_k.weight": (K * D // H, D), "blk.0.attn_v.weight": (K * D // H, D),
                   "blk.0.attn_output.weight": (D, D), "blk.0.ffn_gate.weight": (F, D), "blk.0.ffn_up.weight": (F, D),
                   "blk.0.ffn_down.weight": (D, F)})
    if arch == "qwen2":
        shapes.update({"blk.0.attn_q.bias": (D,), "blk.0.attn_k.bias": (K * D // H,), "blk.0.attn_v.bias": (K * D // H,)})
    for name, shape in shapes.items():
        if len(shape) == 1:
            w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))
        elif qt in (T.Q4_0, T.Q5_0, T.Q5_1, T.BF16):
            q = gguf.quants.quantize((rng.standard_normal(shape) * 0.1).astype(np.float32), qt)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
        elif qt == T.F16:
            w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float16))
        else:
            q = _blocks(shape[0], shape[1], qt, rng)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("qname", ["Q4_0", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16"])
def test_block_types_dequantise_as_gguf_does(tmp_path, qname):
    import gguf
    from gguf.constants import GGMLQuantizationType as T
    from gguf.quants import dequantize

    path = tmp_path / f"{qname}.gguf"
    _write(path, "llama", T[qname], tied=False)
    ck = load_gguf(path)
    assert ck.quant == qname
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        ref = dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)])
        if t.name.endswith(("attn_q.weight", "attn_k.weight")):
            ref = _unpermute(ref, 4 if "attn_q" in t.name else 2)
        parts = t.name.split(".")
        hf = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}.get(parts[0])
        hf = f"{hf}.weight" if hf else f"model.layers.{parts[1]}.{_HF[parts[2]]}.{parts[3]}"
        assert np.array_equal(ck.state_dict[hf].numpy(), ref), t.name


def test_tied_qwen2_q4_k_logits_equal_transformers(tmp_path):
    """Qwen2.5-0.5B's shape of file: qwen2, q/k/v biases, no output.weight, K-quant blocks."""
    transformers = pytest.importorskip("transformers")
    from gguf.constants import GGMLQuantizationType as T
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from engine.loading import load

    path = tmp_path / "qwen.gguf"
    _write(path, "qwen2", T.Q4_K, tied=True)
    cfg = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    config = transformers.Qwen2Config(**{k: v for k, v in cfg.items() if k != "model_type"})
    assert config.tie_word_embeddings
    with torch.device("meta"):
        skeleton = transformers.AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]
    ref_model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ref_model.load_state_dict(tensors, strict=False)
    ref_model.tie_weights()
    ours = load(str(path))
    assert ours.config["tie_word_embeddings"] and ours.config["rope_theta"] == 1000000.0
    ids = list(range(3, 43))
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0]
    out = ours.model.full_logits(ids)
    # random K-quant blocks make large activations; fp32 sums in another order (the engine's own,
    # the same on this model's HF-directory copy) land ~2.5e-5 of the logits' size apart
    assert (ref - out).abs().max().item() <= 1e-4 * max(1.0, ref.abs().max().item())


# ---------------------------------------------------------------------------------------------
# Split files (llama.cpp's gguf-split): refused with one clear line
# ---------------------------------------------------------------------------------------------
def test_split_gguf_is_refused_clearly(make_tiny_gguf, tmp_path):
    import gguf

    from engine.loading import load

    d = tmp_path / "split"
    d.mkdir()
    rest = ("blk.1.ffn_up.weight", "blk.1.ffn_down.weight", "blk.1.ffn_gate.weight")
    first, _, _ = make_tiny_gguf("llama", name="split/tiny-00001-of-00002.gguf", drop=rest,
                                 extra_kv={"split.no": 0, "split.count": 2, "split.tensors.count": 21})
    second = d / "tiny-00002-of-00002.gguf"
    w = gguf.GGUFWriter(str(second), "llama")  # later parts carry only the split keys and tensors
    w.add_uint16("split.no", 1)
    w.add_uint16("split.count", 2)
    w.add_int32("split.tensors.count", 21)
    for name in rest:
        w.add_tensor(name, np.zeros((16, 24) if name.endswith("down.weight") else (24, 16), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for path, part in ((first, 1), (second, 2)):
        with pytest.raises(ModelLoadError, match=rf"part {part} of 2 of a split GGUF .*merge") as e:
            load_gguf(path)
        assert "\n" not in str(e.value) and str(path) in str(e.value)
    with pytest.raises(ModelLoadError, match="part 1 of 2 of a split GGUF"):
        load(str(d))  # the directory the parts were downloaded to
    # a one-part "split" is an ordinary file
    single, _, _ = make_tiny_gguf("llama", name="single.gguf", extra_kv={"split.no": 0, "split.count": 1})
    assert load_gguf(single).config["num_hidden_layers"] == 2


def test_directory_of_several_ggufs_names_them(make_tiny_gguf, tmp_path):
    from engine.loading import load

    (tmp_path / "two").mkdir()
    make_tiny_gguf("llama", name="two/model.Q4_K_M.gguf")
    make_tiny_gguf("llama", name="two/model.Q8_0.gguf")
    with pytest.raises(ModelLoadError, match=r"holds 2 \.gguf files \(model\.Q4_K_M\.gguf, model\.Q8_0\.gguf\)"):
        load(str(tmp_path / "two"))


# ---------------------------------------------------------------------------------------------
# Tokenizers: added tokens outside the byte alphabet, stop ids
# ---------------------------------------------------------------------------------------------
def _metadata(extra_tokens: list[tuple[str, int]], pre: str, bos: str | None, eos: str, template: str | None = None) -> dict:
    """A tokenizer's GGUF metadata: tests.conftest's tiny vocabulary, its three ChatML specials
    renamed (control tokens that end nothing), then ``extra_tokens`` ((text, token type) pairs)."""
    tokens, types, merges = tiny_vocab()
    tokens = [f"<|reserved_special_token_{i}|>" for i in range(3)] + tokens[3:]
    tokens, types = tokens + [t for t, _ in extra_tokens], types + [ty for _, ty in extra_tokens]
    md = {"general.architecture": "qwen2", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
          "tokenizer.ggml.eos_token_id": tokens.index(eos), "tokenizer.ggml.add_bos_token": False}
    if bos is not None:
        md["tokenizer.ggml.bos_token_id"] = tokens.index(bos)
    if template is not None:
        md["tokenizer.chat_template"] = template
    return md


DEEPSEEK = [("<｜begin▁of▁sentence｜>", 3), ("<｜end▁of▁sentence｜>", 3), ("<｜User｜>", 3), ("<｜Assistant｜>", 3),
            ("<｜tool▁sep｜>", 3), ("⟨note⟩", 4)]
DEEPSEEK_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
                     "{% else %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
                     "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}")


def test_added_tokens_outside_the_byte_alphabet_are_matched_whole():
    """DeepSeek-R1-Distill-Qwen files (pre "deepseek-r1-qwen"): llama.cpp's converter stores added
    tokens as their text, "<｜User｜>" with full-width bars and U+2581. They were respelled as byte
    symbols, so the chat template's "<｜User｜>" and its bos_token ("<ï½ľbeginâĸģ...") were encoded
    as a dozen byte pieces each instead of one token."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    from engine.tokenizer import _QWEN2_SPLIT

    md = _metadata(DEEPSEEK, "deepseek-r1-qwen", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", DEEPSEEK_TEMPLATE)
    tokens, types, merges = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"], md["tokenizer.ggml.merges"]
    ours = Tokenizer.from_gguf(md)

    # the model's own tokenizer.json: BPE over the byte-level vocabulary, added tokens as their text
    ref = Backend(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ")) for m in merges]))
    ref.normalizer = normalizers.NFC()
    ref.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    ref.decoder = decoders.ByteLevel()
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (3, 4):
            (ref.add_special_tokens if ty == 3 else ref.add_tokens)([AddedToken(t, special=ty == 3, normalized=False)])
            assert ref.token_to_id(t) == i

    bos, user, asst = (tokens.index(t) for t in ("<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"))
    assert ours.template_variables()["bos_token"] == "<｜begin▁of▁sentence｜>"
    prompt = ours.apply_chat_template([{"role": "user", "content": "the xyz"}])
    assert prompt == "<｜begin▁of▁sentence｜><｜User｜>the xyz<｜Assistant｜><think>\n"
    ids = ours.encode(prompt)
    assert ids[:2] == [bos, user] and asst in ids and len(ids) < 15
    for text in (prompt, "a<｜tool▁sep｜>b ⟨note⟩ c", "<｜User｜>😀 Ünï<｜end▁of▁sentence｜>", "the ⟨note⟩the"):
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False).ids, text
        assert ours.decode(ours.encode(text)) == text == ref.decode(ref.encode(text).ids, skip_special_tokens=False)
    assert ours.is_special(bos) and ours.decode([bos, user, ours.token_to_id("t")], skip_special_tokens=True) == "t"
    assert ours.vocab_size == len(tokens)  # no token was added past the embedding's rows
    assert ours.token_str(user) == "<｜User｜>" and ours.token_bytes(user) == "<｜User｜>".encode()


LLAMA3 = [("<|begin_of_text|>", 3), ("<|end_of_text|>", 3), ("<|start_header_id|>", 3), ("<|end_header_id|>", 3),
          ("<|eom_id|>", 3), ("<|eot_id|>", 3)]
LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
                   "{{ m.content }}<|eot_id|>{% endfor %}"
                   "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def test_llama3_instruct_stops_at_each_of_its_end_tokens():
    """Llama 3.x Instruct files say eos = <|eot_id|>; the model may also end with <|end_of_text|>
    or <|eom_id|> (generation_config.json: [128001, 128008, 128009]; llama.cpp stops at all
    three). Only <|eot_id|> stopped generation: the others were decoded as text and it ran on."""
    md = _metadata(LLAMA3, "llama-bpe", "<|begin_of_text|>", "<|eot_id|>", LLAMA3_TEMPLATE)
    tokens = md["tokenizer.ggml.tokens"]
    tok = Tokenizer.from_gguf(md)
    want = {tokens.index(t) for t in ("<|eot_id|>", "<|end_of_text|>", "<|eom_id|>")}
    assert tok.eos_ids == want and tok.eos_id == tokens.index("<|eot_id|>")
    # a base-model file (eos = <|end_of_text|>, no template) stops at the same three
    md = _metadata(LLAMA3, "llama-bpe", "<|begin_of_text|>", "<|end_of_text|>")
    assert Tokenizer.from_gguf(md).eos_ids == want
    # headers are control tokens but never ends
    assert tokens.index("<|start_header_id|>") not in want


def test_chatml_files_keep_their_own_stop_ids(make_tiny_gguf):
    """The Llama 3 rule leaves ChatML files alone: eos (<|im_end|>) plus the end-of-turn tokens the
    template writes (SmolLM2's generation_config.json lists only <|im_end|>). A Qwen file also stops
    at <|endoftext|> (Qwen2.5's generation_config.json: [151645, 151643]; llama.cpp stops there),
    which it used to decode as text and run on past."""
    from engine.loading import load

    path, _, _ = make_tiny_gguf("llama", tied=True)  # eos 2 = <|im_end|>, 0 = <|endoftext|>
    tok = load(str(path)).tokenizer
    assert tok.token_str(0) == "<|endoftext|>" and tok.eos_id == 2 and tok.eos_ids == {2}
    path, _, _ = make_tiny_gguf("qwen2", pre="qwen2", tied=True, name="q.gguf")
    tok = load(str(path)).tokenizer
    assert tok.eos_id == 2 and tok.eos_ids == {2, 0}
