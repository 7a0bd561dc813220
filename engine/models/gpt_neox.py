"""GPT-NeoX (Pythia): parallel residual, partial rotary, LayerNorm with bias, fused per-head QKV,
GELU MLP, untied embed_out. One page; shape letters as in engine/models/common.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ModelLoadError
from .base import CausalLM
from .common import embed_rows, addmm, as_t, attn_plan, cached_attention, context_limit, mm, require, Rope, rope_params, tensor_getter

MODEL_TYPES = ("gpt_neox",)


@dataclass
class GPTNeoXConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    layer_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    use_parallel_residual: bool = True
    tie_word_embeddings: bool = False
    attention_bias: bool = True
    hidden_act: str = "gelu"
    rope: dict[str, Any] = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], where: str = "config.json") -> "GPTNeoXConfig":
        act = cfg.get("hidden_act", "gelu")
        if act not in ACTS:
            raise ModelLoadError(f"{where}: hidden_act {act!r} is not supported for gpt_neox ({', '.join(ACTS)})")
        return cls(
            vocab_size=int(require(cfg, "vocab_size", where)),
            hidden_size=int(require(cfg, "hidden_size", where)),
            intermediate_size=int(require(cfg, "intermediate_size", where)),
            num_layers=int(require(cfg, "num_hidden_layers", where)),
            num_heads=int(require(cfg, "num_attention_heads", where)),
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-5)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            use_parallel_residual=bool(cfg.get("use_parallel_residual", True)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", True)),
            hidden_act=act,
            rope=rope_params(cfg),
        )


ACTS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class GPTNeoX(CausalLM):
    family = "gpt_neox"

    def __init__(self, cfg: GPTNeoXConfig, sd: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32, max_context: int | None = None):
        super().__init__()
        self.cfg = cfg
        self._dtype = dtype
        self.kv_dims = (cfg.num_layers, cfg.num_heads, cfg.head_dim)
        limit = context_limit(cfg.rope, cfg.max_position_embeddings)
        self.max_context = min(max_context or limit, limit)
        H, E, D = cfg.num_heads, cfg.head_dim, cfg.hidden_size
        self.scale = E ** -0.5
        self.act = ACTS[cfg.hidden_act]
        get = tensor_getter(sd, "GPT-NeoX")
        self.embed = get("gpt_neox.embed_in.weight").to(dtype).contiguous()
        out = sd.get("embed_out.weight", sd.get("lm_head.weight"))  # on-disk name / in-memory name
        if cfg.tie_word_embeddings or out is None:
            out = get("gpt_neox.embed_in.weight") if cfg.tie_word_embeddings else get("embed_out.weight")
        self.lm_head_t = as_t(out, dtype)
        self.ln_f = (get("gpt_neox.final_layer_norm.weight").to(dtype), get("gpt_neox.final_layer_norm.bias").to(dtype))
        self.layers = []
        # HF packs query_key_value as (H, 3, E) per output row; regroup to [all q | all k | all v].
        perm = torch.arange(3 * H * E).view(H, 3, E).transpose(0, 1).reshape(-1)
        zero = torch.zeros(3 * D, dtype=dtype)
        for i in range(cfg.num_layers):
            p = f"gpt_neox.layers.{i}."
            w = get(p + "attention.query_key_value.weight")
            if tuple(w.shape) != (3 * D, D):
                raise ModelLoadError(f"tensor {p}attention.query_key_value.weight has shape {tuple(w.shape)}, config implies {(3 * D, D)}")
            b = sd.get(p + "attention.query_key_value.bias")
            self.layers.append({
                "ln1": (get(p + "input_layernorm.weight").to(dtype), get(p + "input_layernorm.bias").to(dtype)),
                "ln2": (get(p + "post_attention_layernorm.weight").to(dtype), get(p + "post_attention_layernorm.bias").to(dtype)),
                "wqkv": as_t(w[perm], dtype),
                "bqkv": b[perm].to(dtype) if b is not None else zero,
                "wo": as_t(get(p + "attention.dense.weight"), dtype),
                "bo": _bias(sd, p + "attention.dense.bias", D, dtype),
                "w1": as_t(get(p + "mlp.dense_h_to_4h.weight"), dtype),
                "b1": _bias(sd, p + "mlp.dense_h_to_4h.bias", cfg.intermediate_size, dtype),
                "w2": as_t(get(p + "mlp.dense_4h_to_h.weight"), dtype),
                "b2": _bias(sd, p + "mlp.dense_4h_to_h.bias", D, dtype),
            })
        rot = int(E * float(cfg.rope.get("partial_rotary_factor", 1.0)))
        self.rope = Rope(rot, cfg.rope, self.max_context, dtype, self.embed.device)

    def describe(self) -> dict[str, Any]:
        c = self.cfg
        return {"family": "gpt_neox", "layers": c.num_layers, "hidden": c.hidden_size, "heads": c.num_heads,
                "vocab": c.vocab_size, "dtype": str(self._dtype).replace("torch.", "")}

    def forward_rows(self, tokens: torch.Tensor, positions: torch.Tensor, start: int, mask: torch.Tensor | None) -> torch.Tensor:
        c = self.cfg
        H, E, D = c.num_heads, c.head_dim, c.hidden_size
        T = tokens.shape[0]
        x = embed_rows(self.embed, tokens)
        kc, vc = self.cache.k, self.cache.v
        cos, sin = self.rope.cos[positions], self.rope.sin[positions]  # shared by every layer
        plan = attn_plan(mask, start + T, T, 1) if self._dtype == torch.bfloat16 else None
        for i, L in enumerate(self.layers):
            h = F.layer_norm(x, (D,), *L["ln1"], c.layer_norm_eps)
            qkv = addmm(L["bqkv"], h, L["wqkv"])
            qk = self.rope.rotate(qkv[:, :2 * D].view(T, 2 * H, E).transpose(0, 1), cos, sin)  # q and k heads at once
            q, k = qk[:H], qk[H:]
            v = qkv[:, 2 * D:].view(T, H, E).transpose(0, 1)
            a = addmm(L["bo"], cached_attention(q, k, v, kc[i], vc[i], start, mask, self.scale, plan), L["wo"])
            if c.use_parallel_residual:
                h2 = F.layer_norm(x, (D,), *L["ln2"], c.layer_norm_eps)
                x = x + a + self._mlp(h2, L)
            else:
                x = x + a
                x = x + self._mlp(F.layer_norm(x, (D,), *L["ln2"], c.layer_norm_eps), L)
        return F.layer_norm(x, (D,), *self.ln_f, c.layer_norm_eps)

    def _mlp(self, h: torch.Tensor, L: dict) -> torch.Tensor:
        return addmm(L["b2"], self.act(addmm(L["b1"], h, L["w1"])), L["w2"])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return mm(hidden, self.lm_head_t)


def _bias(sd: dict[str, torch.Tensor], name: str, n: int, dtype: torch.dtype) -> torch.Tensor:
    b = sd.get(name)
    return b.to(dtype) if b is not None else torch.zeros(n, dtype=dtype)
