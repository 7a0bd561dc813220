"""Tiny random checkpoints saved with transformers' save_pretrained: they are both our test inputs
and (through transformers) the reference implementation."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

TINY = {
    "llama": dict(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False),
    "llama_tied": dict(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True),
    "llama3_rope": dict(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 32}),
    "linear_rope": dict(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                        rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "yarn_rope": dict(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}),
    "dynamic_rope": dict(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "mistral_window": dict(model_type="mistral", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, sliding_window=48),
    # SmolLM2's attention shape (head size 64, 3 query heads a KV head): the C pass's unrolled attention
    "llama_mha": dict(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=False),
    "llama_hd64": dict(model_type="llama", vocab_size=96, hidden_size=384, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512),
    "mistral": dict(model_type="mistral", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, sliding_window=None),
    "gpt_neox": dict(model_type="gpt_neox", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, rotary_pct=0.25, max_position_embeddings=512, use_parallel_residual=True),
    "gpt_neox_seq": dict(model_type="gpt_neox", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, rotary_pct=0.5, max_position_embeddings=512, use_parallel_residual=False),
    "mamba2": dict(model_type="mamba2", vocab_size=96, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16,
                   state_size=16, n_groups=1, expand=2, conv_kernel=4, tie_word_embeddings=False),
    # a tiny random Mamba-2 over SmolLM2's vocabulary: a drafter for the real target that is almost always wrong
    "mamba2_smol": dict(model_type="mamba2", vocab_size=49152, hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16,
                        state_size=16, n_groups=1, expand=2, conv_kernel=4, tie_word_embeddings=True),
    "mamba": dict(model_type="mamba", vocab_size=96, hidden_size=64, num_hidden_layers=2, state_size=8, expand=2,
                  conv_kernel=4, tie_word_embeddings=False),
    "granite": dict(model_type="granitemoehybrid", vocab_size=96, hidden_size=64, intermediate_size=128,
                    shared_intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                    num_local_experts=0, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1,
                    mamba_d_conv=4, mamba_expand=2, layer_types=["mamba", "attention", "mamba", "attention"],
                    embedding_multiplier=12.0, attention_multiplier=1 / 16, residual_multiplier=0.3, logits_scaling=0.4,
                    position_embedding_type="nope", tie_word_embeddings=False, max_position_embeddings=512),
    # a long context, for tests that must not run out of room (Ctrl-C mid-generation)
    "long": dict(model_type="llama", vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1_000_000),
    # a different, smaller model with the same vocabulary: a drafter that is often wrong
    "draft": dict(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512),
}


def hf_model(kind: str, seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(TINY[kind])
    mt = spec.pop("model_type")
    cfg = AutoConfig.for_model(mt, **spec)
    torch.manual_seed(seed)
    return sharpen(AutoModelForCausalLM.from_config(cfg)).eval()


def sharpen(m):
    """Random init gives near-uniform logits; sharpen them so greedy paths are not ties (SSM decay
    and skip parameters keep their init: scaling them makes the recurrences degenerate)."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            if not name.endswith(("A_log", "dt_bias", ".D")):
                p.mul_(3.0)
    return m


def two_sample_p(a, b) -> float:
    """Chi-square two-sample p-value of two lists of outcomes (rare outcomes pooled so the
    approximation holds)."""
    from collections import Counter

    from scipy.stats import chi2_contingency

    keys = sorted(set(a) | set(b))
    ca, cb = Counter(a), Counter(b)
    table = [[ca[k], cb[k]] for k in keys if ca[k] + cb[k] >= 10]
    rest = [sum(ca[k] for k in keys if ca[k] + cb[k] < 10), sum(cb[k] for k in keys if ca[k] + cb[k] < 10)]
    if sum(rest) > 0:
        table.append(rest)
    return chi2_contingency(table)[1]


@functools.lru_cache(maxsize=None)
def saved(kind: str, root: str, seed: int = 0) -> Path:
    """save_pretrained a tiny model under root/kind-seed and return the directory."""
    path = Path(root) / f"{kind}-{seed}"
    if not (path / "config.json").exists():
        hf_model(kind, seed).save_pretrained(path)
    return path


def hf_greedy(path: Path, prompt: list[int], n: int) -> list[int]:
    return list(_hf_greedy(Path(path), tuple(prompt), n))


@functools.lru_cache(maxsize=None)
def _hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


@functools.lru_cache(maxsize=None)
def _hf_greedy(path: Path, prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    m = _hf_model(path)
    with torch.no_grad():
        out = m.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return tuple(out[0, len(prompt):].tolist())


def uncached_greedy(logits_of, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by a full forward per token (``logits_of(ids) -> (T, V)``): the reference
    for models whose cached multi-token path is suspect (transformers' Mamba-1)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(logits_of(ids)[-1].argmax()))
    return ids[len(prompt):]


def config_of(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())
