"""engine.gguf: GGUF -> HF-style config + float32 state dict (+ tokenizer).

Oracles: transformers' own GGUF weight loading of the shipped SmolLM2 Q4_1 file, and tiny GGUF
files written here with known HF-layout tensors (q/k permuted the way llama.cpp's converter does).
Corrupt files (truncated header or data, bad magic, flipped bytes) must raise ModelLoadError with
one line, never a raw struct/numpy traceback.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.errors import ModelLoadError
from engine.gguf import _llama3_scaling_from_rope_freqs, _unpermute, dequantize_raw, load_gguf, read_gguf
from tests.conftest import llama_cpp_permute


# ---------------------------------------------------------------------------------------------
# SmolLM2 Q4_1 against transformers
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2(smollm2_gguf_path):
    return load_gguf(smollm2_gguf_path)


@pytest.fixture(scope="module")
def hf_gguf(smollm2_gguf_path, smollm2):
    """transformers' GGUF loading path (its config parsing, name mapping, q/k reverse permutation,
    dequantisation). ``from_pretrained(gguf_file=...)`` would need accelerate, so the tensors are
    mapped onto a meta-device skeleton (the skeleton only supplies parameter names)."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    transformers.utils.logging.disable_progress_bar()
    with torch.device("meta"):
        skeleton = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**smollm2.config))
    return load_gguf_checkpoint(str(smollm2_gguf_path), return_tensors=True, model_to_load=skeleton)


def test_smollm2_loads_fast_with_hf_names(smollm2_gguf_path):
    import time

    t0 = time.perf_counter()
    ck = load_gguf(smollm2_gguf_path)
    dt = time.perf_counter() - t0
    print(f"load_gguf(SmolLM2-135M Q4_1): {dt:.2f}s")
    assert dt < 20, "loading a 135M model should take seconds"
    assert ck.quant == "Q4_1"
    cfg = ck.config
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert cfg["tie_word_embeddings"] is True and "lm_head.weight" not in ck.state_dict
    assert cfg["vocab_size"] == 49152 and (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    sd = ck.state_dict
    assert sd["model.embed_tokens.weight"].shape == (49152, 576)
    assert sd["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)  # [out, in]
    assert sd["model.layers.0.mlp.down_proj.weight"].shape == (576, 1536)
    assert all(t.dtype == torch.float32 for t in sd.values())
    assert len(sd) == 2 + 30 * 9


def test_smollm2_config_matches_transformers(smollm2, hf_gguf):
    theirs = hf_gguf["config"]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "vocab_size", "tie_word_embeddings"):
        assert smollm2.config[key] == theirs[key], key
    assert smollm2.config["rope_theta"] == pytest.approx(theirs["rope_theta"])
    assert smollm2.config["rms_norm_eps"] == pytest.approx(theirs["rms_norm_eps"])


def test_smollm2_state_dict_equals_transformers(smollm2, hf_gguf):
    ours, theirs = smollm2.state_dict, hf_gguf["tensors"]
    assert set(ours) == set(theirs) - {"lm_head.weight"}  # tied: transformers lists the shared tensor twice
    worst = 0.0
    for name in ours:
        assert ours[name].shape == theirs[name].shape, name
        worst = max(worst, (ours[name] - theirs[name].float()).abs().max().item())
    print(f"max |ours - transformers| over all {len(ours)} tensors: {worst:g}")
    assert worst == 0.0
    # the ones the brief singles out, spelled out
    for i in (0, 17, 29):
        for proj in "qkvo":
            n = f"model.layers.{i}.self_attn.{proj}_proj.weight"
            assert torch.equal(ours[n], theirs[n].float()), n


def test_smollm2_qk_are_unpermuted(smollm2, smollm2_gguf_path):
    """Our q/k rows are the GGUF rows with llama.cpp's permutation undone: permuting them again
    gives back exactly what the file stores."""
    with read_gguf(smollm2_gguf_path) as f:
        q_file = f.read_tensor("blk.3.attn_q.weight")
        k_file = f.read_tensor("blk.3.attn_k.weight")
        v_file = f.read_tensor("blk.3.attn_v.weight")
    q = smollm2.state_dict["model.layers.3.self_attn.q_proj.weight"].numpy()
    k = smollm2.state_dict["model.layers.3.self_attn.k_proj.weight"].numpy()
    v = smollm2.state_dict["model.layers.3.self_attn.v_proj.weight"].numpy()
    assert np.array_equal(llama_cpp_permute(q, 9), q_file)
    assert np.array_equal(llama_cpp_permute(k, 3), k_file)
    assert not np.array_equal(q, q_file)
    assert np.array_equal(v, v_file)  # v is never permuted


# ---------------------------------------------------------------------------------------------
# Tiny files with known tensors
# ---------------------------------------------------------------------------------------------
def test_fast_dequantisation_is_gguf_bit_for_bit(smollm2_gguf_path):
    """engine.gguf.dequantize_raw (chunks of rows) gives gguf.quants' exact bits: every sixth Q4_1 /
    Q8_0 tensor of SmolLM2 and the embedding, and random blocks across chunk edges."""
    import gguf
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.quants import dequantize, quantize

    with read_gguf(smollm2_gguf_path) as f:
        names = [n for n, i in f.tensors.items() if i.qtype.name in ("Q4_1", "Q8_0")]
        assert len(names) > 200
        for name in names[::6] + ["token_embd.weight"]:
            info = f.tensors[name]
            block, size = GGML_QUANT_SIZES[info.qtype]
            raw = np.frombuffer(f._mm, dtype=np.uint8, count=info.nbytes, offset=info.offset).reshape(info.shape[0], -1)
            assert dequantize_raw(raw, info.qtype.name).tobytes() == np.asarray(dequantize(raw, info.qtype), np.float32).tobytes(), name
            del raw
    rng = np.random.default_rng(2)
    for qt in ("Q4_1", "Q8_0"):
        w = (rng.standard_normal((37, 96)) * rng.uniform(0.01, 4, (37, 1))).astype(np.float32)
        raw = quantize(w, gguf.GGMLQuantizationType[qt])
        want = np.asarray(dequantize(raw, gguf.GGMLQuantizationType[qt]), np.float32)
        for chunk in (1, 5, 36, 4096):
            assert np.array_equal(dequantize_raw(raw, qt, chunk=chunk), want)


def test_deferred_load_materializes_to_the_full_state_dict(tmp_path):
    """load_gguf(defer=True): the matrices kept in blocks are shape-only "meta" placeholders (the
    tied head too) until ``materialize()``, which gives load_gguf()'s state dict exactly."""
    from tests.test_quant import _write_quantised_llama

    path = tmp_path / "q.gguf"
    _write_quantised_llama(path, mixed=True)
    full = load_gguf(path)
    ck = load_gguf(path, defer=True)
    assert ck.config == full.config and set(ck.blocks) == set(full.blocks)
    assert ck.state_dict["model.embed_tokens.weight"].device.type == "cpu"
    meta = {k for k, v in ck.state_dict.items() if v.is_meta}
    assert meta == (set(full.blocks) - {"model.embed_tokens.weight"}) | {"lm_head.weight"}
    assert "model.layers.0.mlp.down_proj.weight" not in meta  # F16: no blocks kept, read now
    ck.materialize()
    assert ck.deferred == {} and set(ck.state_dict) == set(full.state_dict)
    for k, v in full.state_dict.items():
        assert torch.equal(ck.state_dict[k], v), k
    # a file rewritten between the load and the deferred read: one line, not a model of two files
    import os

    ck = load_gguf(path, defer=True)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(ModelLoadError, match="changed after it was loaded"):
        ck.materialize()


def test_unpermute_inverts_llama_cpp_permute():
    rng = np.random.default_rng(1)
    for heads, head_dim, cols in ((1, 2, 3), (4, 8, 5), (3, 64, 7)):
        w = rng.standard_normal((heads * head_dim, cols)).astype(np.float32)
        assert np.array_equal(_unpermute(llama_cpp_permute(w, heads), heads), w)
        b = rng.standard_normal(heads * head_dim).astype(np.float32)  # biases are permuted too
        assert np.array_equal(_unpermute(llama_cpp_permute(b, heads), heads), b)


@pytest.mark.parametrize("arch,tied", [("llama", False), ("llama", True), ("qwen2", False)])
def test_tiny_roundtrip_exact(make_tiny_gguf, arch, tied):
    path, sd, cfg = make_tiny_gguf(arch, tied=tied)
    ck = load_gguf(path)
    assert set(ck.state_dict) == set(sd)
    for name, t in sd.items():
        assert torch.equal(ck.state_dict[name], torch.from_numpy(t)), name
    for key, val in cfg.items():
        assert ck.config[key] == val, key
    assert ck.config["model_type"] == arch
    assert ck.quant == "F32"
    assert ck.tokenizer.decode(ck.tokenizer.encode("the xyz")) == "the xyz"


def test_tiny_llama_with_biases(make_tiny_gguf):
    path, sd, _ = make_tiny_gguf("llama", bias=True)
    ck = load_gguf(path)
    assert ck.config["attention_bias"] is True
    for name, t in sd.items():
        assert torch.equal(ck.state_dict[name], torch.from_numpy(t)), name  # q/k biases unpermuted too
    path, _, _ = make_tiny_gguf("llama", bias=True, name="partial.gguf",
                                drop=("blk.0.attn_output.bias", "blk.1.attn_output.bias"))
    with pytest.raises(ModelLoadError, match="attention biases only on"):
        load_gguf(path)


def test_shape_mismatch_is_named(make_tiny_gguf):
    path, _, _ = make_tiny_gguf("llama", extra_kv={"llama.feed_forward_length": 20}, name="ffn.gguf")
    with pytest.raises(ModelLoadError, match=r"blk\.0\.ffn_\w+\.weight has shape \[24, 16\], the config implies \[20, 16\]"):
        load_gguf(path)


def test_tiny_f16_and_q8_0(tmp_path):
    """Half and quantised (Q8_0) tensors dequantise exactly as gguf.quants does."""
    import gguf
    from gguf.quants import dequantize, quantize

    from tests.conftest import tiny_vocab

    rng = np.random.default_rng(2)
    tokens, types, merges = tiny_vocab()
    V, D = len(tokens), 32
    path = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in (("block_count", 1), ("embedding_length", D), ("feed_forward_length", 64),
                 ("attention.head_count", 2), ("attention.head_count_kv", 2), ("context_length", 64)):
        w.add_uint32(f"llama.{k}", v)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    ref = {}
    shapes = {"token_embd.weight": (V, D), "output_norm.weight": (D,), "blk.0.attn_norm.weight": (D,),
              "blk.0.ffn_norm.weight": (D,), "blk.0.attn_q.weight": (D, D), "blk.0.attn_k.weight": (D, D),
              "blk.0.attn_v.weight": (D, D), "blk.0.attn_output.weight": (D, D), "blk.0.ffn_gate.weight": (64, D),
              "blk.0.ffn_up.weight": (64, D), "blk.0.ffn_down.weight": (D, 64)}
    for name, shape in shapes.items():
        t = rng.standard_normal(shape).astype(np.float32)
        ref[name] = t
        if len(shape) == 1:
            w.add_tensor(name, t)
        elif name.endswith(("attn_q.weight", "attn_k.weight")):
            w.add_tensor(name, t.astype(np.float16))
        else:
            q = quantize(t, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ck = load_gguf(path)
    emb = ck.state_dict["model.embed_tokens.weight"].numpy()
    assert emb.shape == (V, D)
    q8 = gguf.GGMLQuantizationType.Q8_0
    assert np.array_equal(emb, dequantize(quantize(ref["token_embd.weight"], q8), q8))
    assert np.abs(emb - ref["token_embd.weight"]).max() < 0.05  # and Q8_0 is close to the original
    q_unperm = _unpermute(ref["blk.0.attn_q.weight"].astype(np.float16).astype(np.float32), 2)
    assert np.array_equal(ck.state_dict["model.layers.0.self_attn.q_proj.weight"].numpy(), q_unperm)
    assert ck.quant == "Q8_0"


def test_unsupported_architecture(make_tiny_gguf):
    path, _, _ = make_tiny_gguf("gpt2")
    with pytest.raises(ModelLoadError) as e:
        load_gguf(path)
    msg = str(e.value)
    assert "architecture 'gpt2' is not supported (supported: llama, qwen2)" in msg
    assert str(path) in msg and "\n" not in msg


def test_missing_tensor_is_named(make_tiny_gguf):
    path, _, _ = make_tiny_gguf("llama", drop=("blk.1.ffn_up.weight",))
    with pytest.raises(ModelLoadError, match=r"blk\.1\.ffn_up\.weight.*missing"):
        load_gguf(path)


def test_unsupported_tokenizer_model(make_tiny_gguf):
    """A unigram (t5) or WordPiece (bert) vocabulary is refused in one line; a sentencepiece (llama)
    one needs its scores (tests/test_gguf_spm.py has the supported case)."""
    for model, what in (("t5", r"unigram \(t5\) is not supported"), ("bert", r"WordPiece \(bert\) is not supported"),
                        ("llama", r"sentencepiece \(llama\) is not supported without tokenizer.ggml.scores")):
        path, _, _ = make_tiny_gguf("llama", tokenizer_model=model, name=f"{model}.gguf")
        with pytest.raises(ModelLoadError, match=what):
            load_gguf(path)


def test_llama3_rope_freqs_recovered():
    """Llama 3.1 GGUFs carry rope scaling as a rope_freqs tensor; we recover the HF dict."""
    base, dim = 500000.0, 64
    factor, low, high, orig = 32.0, 1.0, 4.0, 8192
    inv = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    ff = []
    for f in inv:  # llama.cpp convert_hf_to_gguf.py LlamaModel.generate_extra_tensors
        wl = 2 * math.pi / f
        if wl < orig / high:
            ff.append(1.0)
        elif wl > orig / low:
            ff.append(factor)
        else:
            s = (orig / wl - low) / (high - low)
            ff.append(1 / ((1 - s) / factor + s))
    got = _llama3_scaling_from_rope_freqs(np.array(ff, np.float32), {"head_dim": dim, "rope_theta": base}, {}, "x.gguf")
    assert got["rope_type"] == "llama3" and got["original_max_position_embeddings"] == orig
    assert got["factor"] == pytest.approx(factor)
    assert got["low_freq_factor"] == pytest.approx(low, rel=1e-3)
    assert got["high_freq_factor"] == pytest.approx(high, rel=1e-3)
    with pytest.raises(ModelLoadError, match="rope_freqs"):
        _llama3_scaling_from_rope_freqs(np.linspace(1, 5, dim // 2), {"head_dim": dim, "rope_theta": base}, {}, "x.gguf")


# ---------------------------------------------------------------------------------------------
# Corrupt files
# ---------------------------------------------------------------------------------------------
def _expect_one_line_error(path) -> str:
    with pytest.raises(ModelLoadError) as e:
        load_gguf(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg, msg
    return msg


@pytest.fixture
def tiny_bytes(make_tiny_gguf):
    path, _, _ = make_tiny_gguf("llama")
    data = path.read_bytes()
    with read_gguf(path) as f:
        data_start = min(t.offset for t in f.tensors.values())
    return path, data, data_start


def test_bad_magic(tiny_bytes, tmp_path):
    _, data, _ = tiny_bytes
    p = tmp_path / "magic.gguf"
    p.write_bytes(b"GGUX" + data[4:])
    assert "not a GGUF file" in _expect_one_line_error(p)
    p.write_bytes(b"")
    assert "empty" in _expect_one_line_error(p)


def test_truncated_header(tiny_bytes, tmp_path):
    _, data, data_start = tiny_bytes
    for cut in sorted({3, 4, 7, 15, 23, 40, 200, data_start // 2, data_start - 40, data_start - 1}):
        p = tmp_path / f"head{cut}.gguf"
        p.write_bytes(data[:cut])
        msg = _expect_one_line_error(p)
        assert any(w in msg for w in ("truncated", "not a GGUF")), (cut, msg)


def test_truncated_tensor_data(tiny_bytes, tmp_path):
    _, data, data_start = tiny_bytes
    for cut in (data_start, data_start + 5, len(data) - 1, len(data) - 1000):
        p = tmp_path / f"data{cut}.gguf"
        p.write_bytes(data[:cut])
        assert "tensor data is truncated" in _expect_one_line_error(p), cut


def test_garbage_counts(tiny_bytes, tmp_path):
    """A huge count in the header is caught by the size check, not by a long loop or MemoryError."""
    _, data, _ = tiny_bytes
    for off in (8, 16):  # tensor count, metadata count
        p = tmp_path / f"count{off}.gguf"
        p.write_bytes(data[:off] + (2**60).to_bytes(8, "little") + data[off + 8:])
        assert "truncated or corrupt" in _expect_one_line_error(p)
    p = tmp_path / "version.gguf"
    p.write_bytes(data[:4] + (7).to_bytes(4, "little") + data[8:])
    assert "version 7" in _expect_one_line_error(p)


def test_random_byte_flips_never_crash(tiny_bytes, tmp_path):
    """Fuzz the header: every outcome is a clean load or a one-line ModelLoadError."""
    _, data, data_start = tiny_bytes
    rng = np.random.default_rng(0)
    p = tmp_path / "fuzz.gguf"
    outcomes = {"ok": 0, "error": 0}
    for _ in range(150):
        buf = bytearray(data)
        for pos in rng.integers(4, data_start, size=int(rng.integers(1, 4))):
            buf[pos] = int(rng.integers(0, 256))
        p.write_bytes(bytes(buf))
        try:
            load_gguf(p)
            outcomes["ok"] += 1
        except ModelLoadError as e:
            assert "\n" not in str(e)
            outcomes["error"] += 1
    assert outcomes["error"] > 0


def _tensor_field(data: bytes, name: str) -> tuple[int, int]:
    """(byte position of ``name``'s u32 type, of its u64 offset) in the tensor directory."""
    import struct

    key = struct.pack("<Q", len(name)) + name.encode()
    pos = data.index(key) + len(key)
    n_dims = struct.unpack_from("<I", data, pos)[0]
    type_at = pos + 4 + 8 * n_dims
    return type_at, type_at + 4


def test_misplaced_tensor_data_is_refused(tiny_bytes, tmp_path):
    """A tensor's offset moved off the alignment, or onto another tensor's bytes, and a type changed
    to a bigger one (its bytes then run into the next tensor's) are corrupt headers, not models that
    run on other tensors' bytes (a tester's moved offset gave <|endoftext|> forever, exit 0)."""
    import struct

    path, data, _ = tiny_bytes
    with read_gguf(path) as f:
        infos = sorted(f.tensors.values(), key=lambda t: t.offset)
    first, second = infos[0], infos[1]
    base = first.offset  # tensor offsets are relative to the data section's start
    _, off_at = _tensor_field(data, second.name)
    for new, expect in ((second.offset - base + 7, "not a multiple of general.alignment"),
                        (first.offset - base, "overlap")):
        p = tmp_path / f"moved{new}.gguf"
        p.write_bytes(data[:off_at] + struct.pack("<Q", new) + data[off_at + 8:])
        assert expect in _expect_one_line_error(p), new
    type_at, _ = _tensor_field(data, first.name)
    p = tmp_path / "wider.gguf"
    p.write_bytes(data[:type_at] + struct.pack("<I", 28) + data[type_at + 4:])  # F32 -> F64: twice the bytes
    msg = _expect_one_line_error(p)
    assert "overlap" in msg, msg
