"""Llama family: SmolLM2, Llama 2/3, Mistral, Qwen2 (qkv bias). GQA, RoPE (+ scaling), tied or
untied embeddings. One page; generation logic lives in engine/generate.py.

Weights are stored transposed ([in, out]) and fused (QKV, gate|up) for fast small-row GEMMs on
CPU (reference/cpu-performance.md). Shape letters as in engine/models/common.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..cache import KVCache
from ..errors import ModelLoadError
from .base import CausalLM
from .common import (embed_rows, Linear, Rope, as_t, attn_plan, cached_attention, context_limit, mm, prefill_attention, prefill_bias, require,
                     rms_norm, rope_params, rotate_half, tensor_getter)

MODEL_TYPES = ("llama", "mistral", "qwen2", "smollm2", "smollm3")
GLUE_BF16 = True  # bf16 passes through engine/native/glue_bf16.c where it applies (tests switch it)


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    rope: dict[str, Any] = field(default_factory=dict)
    model_type: str = "llama"
    sliding_window: int | None = None

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], where: str = "config.json") -> "LlamaConfig":
        mt = cfg.get("model_type", "llama")
        hidden = int(require(cfg, "hidden_size", where))
        heads = int(require(cfg, "num_attention_heads", where))
        kv = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        if heads % kv:
            raise ModelLoadError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
        attn_bias = bool(cfg.get("attention_bias", False))
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ModelLoadError(f"{where}: hidden_act {act!r} is not supported for {mt} (silu)")
        return cls(
            vocab_size=int(require(cfg, "vocab_size", where)),
            hidden_size=hidden,
            intermediate_size=int(require(cfg, "intermediate_size", where)),
            num_layers=int(require(cfg, "num_hidden_layers", where)),
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=attn_bias or mt == "qwen2",
            o_bias=attn_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            rope=rope_params(cfg),
            model_type=mt,
            sliding_window=cfg.get("sliding_window") if cfg.get("use_sliding_window", mt == "mistral") else None,
        )


NATIVE_LONG_PREFILL = True  # long prefill chunks take the C pass where its attention runs grouped (A/Bs switch it)
PREFILL_ROWS = 65  # the longest chain --backtrack recompute re-prefills: a root and 64 accepted drafts (draft_len <= 64)
PREFILL_ATTENTION = True  # torch pass: fp32 prefill chunks over PREFILL_ROWS rows use common.prefill_attention (A/Bs switch it)


def glue_fits(cfg: LlamaConfig) -> bool:
    """Whether bf16 passes of a model of this configuration can take engine/native/glue_bf16.c
    (Llama._glue): no projection biases, heads a multiple of 16 features wide (the attention
    kernel's), an even rotary width within the kernel's 1024, at most 64 query heads a KV head."""
    rot = int(cfg.head_dim * float(cfg.rope.get("partial_rotary_factor", 1.0)))
    return (cfg.head_dim % 16 == 0 and rot % 2 == 0 and 0 < rot <= min(cfg.head_dim, 1024)
            and cfg.num_heads // cfg.num_kv_heads <= 64 and not (cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias))


def bf16_fits(cfg: LlamaConfig) -> bool:
    """Whether a model of this configuration takes the CPU bf16 compute type (``Llama.keep_bf16``):
    the bf16 C pass is on here (``native.bf16_records_on``: AVX2 + FMA, AVX-512 BF16 or AMX), every product's input
    size is even (bf16 pairs), and the C pass takes the shapes with a bf16 KV cache (even head and
    rotary widths; head size a multiple of 8 up to 128: ``llama_rows_kv16_ok``). The one test the
    loader, ``--dtype auto`` (dtype_probe.bf16_c_pass) and ``keep_bf16`` share."""
    from .. import native

    if not native.bf16_records_on():
        return False
    rot = int(cfg.head_dim * float(cfg.rope.get("partial_rotary_factor", 1.0)))
    return (cfg.hidden_size % 2 == 0 and cfg.intermediate_size % 2 == 0 and cfg.num_heads * cfg.head_dim % 2 == 0
            and cfg.head_dim % 2 == 0 and rot % 2 == 0 and bool(native.lib().llama_rows_kv16_ok(cfg.head_dim)))


def glue_lib():
    """engine/native's library where bf16 passes may take glue_bf16.c (it loads and nothing switches
    the glue or the C attention off), else None."""
    from .. import native
    from .common import NATIVE_ATTN

    lib = native.lib()
    return lib if lib is not None and GLUE_BF16 and native.glue_enabled() and NATIVE_ATTN else None


def _fuse(ws: list[torch.Tensor]) -> torch.Tensor:
    """[out, in] matrices stacked by rows; "meta" placeholders (engine/gguf.py ``defer``) give a
    placeholder of the stacked shape (torch.cat on meta tensors imports torch._dynamo: seconds)."""
    if any(w.is_meta for w in ws):
        return torch.empty(sum(w.shape[0] for w in ws), ws[0].shape[1], device="meta")
    return torch.cat(ws, 0)


class Llama(CausalLM):
    bf16_fits = staticmethod(bf16_fits)
    family = "llama"

    def __init__(self, cfg: LlamaConfig, sd: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32, max_context: int | None = None):
        super().__init__()
        self.cfg = cfg
        self._dtype = dtype
        self.kv_dims = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        self.kv_bf16 = False  # the KV cache in bf16 (use_bf16_kv: the q8 compute type)
        limit = context_limit(cfg.rope, cfg.max_position_embeddings, cfg.sliding_window)
        self.max_context = min(max_context or limit, limit)
        self.scale = cfg.head_dim ** -0.5
        get = tensor_getter(sd, "Llama")
        self.embed = get("model.embed_tokens.weight").to(dtype).contiguous()  # (V, D)
        lm = sd.get("lm_head.weight")
        if cfg.tie_word_embeddings and not (lm is not None and lm.is_meta):
            lm = None  # tied: the embedding; a "meta" head is a GGUF loader's placeholder for its blocks (engine/gguf.py)
        if lm is None:
            lm = get("model.embed_tokens.weight")
        self.lm_head_t = as_t(lm, dtype)  # (D, V)
        self.norm = get("model.norm.weight").to(dtype)
        self.layers = []
        H, K, E = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            q = get(p + "self_attn.q_proj.weight", (H * E, cfg.hidden_size))
            k = get(p + "self_attn.k_proj.weight", (K * E, cfg.hidden_size))
            v = get(p + "self_attn.v_proj.weight")
            layer = {
                "ln1": get(p + "input_layernorm.weight").to(dtype),
                "ln2": get(p + "post_attention_layernorm.weight").to(dtype),
                "wqkv": as_t(_fuse([q, k, v]), dtype),  # (D, (H + 2K) E)
                "wo": as_t(get(p + "self_attn.o_proj.weight"), dtype),
                "wgu": as_t(_fuse([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]), dtype),
                "wd": as_t(get(p + "mlp.down_proj.weight"), dtype),
                "bqkv": None, "bo": None, "bgu": None, "bd": None,
            }
            if cfg.qkv_bias:
                layer["bqkv"] = torch.cat([get(p + "self_attn.q_proj.bias"), get(p + "self_attn.k_proj.bias"), get(p + "self_attn.v_proj.bias")]).to(dtype)
            if cfg.o_bias:
                layer["bo"] = get(p + "self_attn.o_proj.bias").to(dtype)
            if cfg.mlp_bias:
                layer["bgu"] = torch.cat([get(p + "mlp.gate_proj.bias"), get(p + "mlp.up_proj.bias")]).to(dtype)
                layer["bd"] = get(p + "mlp.down_proj.bias").to(dtype)
            self.layers.append(layer)
        rot = int(E * float(cfg.rope.get("partial_rotary_factor", 1.0)))
        self.rope = Rope(rot, cfg.rope, self.max_context, dtype, self.embed.device)

    def keep_quantized(self, blocks: dict[str, tuple[str, Any]], act8: bool = False) -> int:
        """Swap fp32 projections for GGUF-quantised ones (engine/models/quant.py) where every source
        matrix of a projection is quantised in the same format; bit-identical products, ~1/5 of the
        bytes. ``act8``: the q8 compute type's records instead (8-bit activations; not bit-identical
        to fp32, a dtype of its own). Returns the number of projections swapped."""
        from . import quant

        def swap(names: list[str], lin: Linear) -> Linear:
            got = [blocks.get(n) for n in names]
            if any(g is None for g in got) or len({g[0] for g in got}) != 1 or lin.dtype != torch.float32:
                return lin
            K, N = lin.shape
            raw = np.concatenate([g[1] for g in got], 0)
            if raw.shape[0] != N:
                return lin
            qt = got[0][0] + ("a8" if act8 else "")
            return Linear.quantized(quant.pack(raw, qt, K), qt, K, N)

        self.__dict__.pop("_native_tab", None)  # the native pass's weight table is rebuilt
        n = 0
        if act8:
            self.use_bf16_kv()
        # the head's own matrix; the embedding's only when they are tied (an untied head in a type
        # without kept blocks, F16 or Q6_K, stays as it is)
        head = "model.embed_tokens.weight" if self.cfg.tie_word_embeddings else "lm_head.weight"
        new = swap([head], self.lm_head_t)
        n += new is not self.lm_head_t
        self.lm_head_t = new
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            for key, names in (("wqkv", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]), ("wo", ["self_attn.o_proj"]),
                               ("wgu", ["mlp.gate_proj", "mlp.up_proj"]), ("wd", ["mlp.down_proj"])):
                new = swap([f"{p}{m}.weight" for m in names], layer[key])
                n += new is not layer[key]
                layer[key] = new
        return n

    def keep_bf16(self) -> bool:
        """The CPU bf16 compute type on an fp32-built model: every projection and the head as bf16
        records (engine/native/bf16_rows.c: bf16 weights, activations rounded to bf16 per product,
        fp32 sums), the embedding in bf16 (its rows widened on lookup), the KV cache in bf16, and
        the rest of the pass (norms, rotary, attention, residual stream) in fp32 inside the C pass
        (llama_rows.c). Where it applies: CPU, fp32-built, ``bf16_fits``. Returns whether it is on;
        the model is unchanged otherwise. (engine/loading.py builds such a model's projections as
        bf16 records at once: ``common.building_bf16_records``.)"""
        ok = (bf16_fits(self.cfg) and self._dtype == torch.float32 and self.embed.device.type == "cpu"
              and all(isinstance(L[k], Linear) for L in self.layers for k in ("wqkv", "wo", "wgu", "wd"))
              and isinstance(self.lm_head_t, Linear) and self.use_bf16_kv())
        if not ok:
            return False
        self.__dict__.pop("_native_tab", None)  # the native pass's weight table is rebuilt
        for L in self.layers:
            for k in ("wqkv", "wo", "wgu", "wd"):
                L[k] = L[k].to_bf16()
        self.lm_head_t = self.lm_head_t.to_bf16()
        self.embed = self.embed.to(torch.bfloat16)
        self._compute_dtype = torch.bfloat16
        return True

    def _embed_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """The embedding's rows of ``tokens`` in the pass's dtype (a new tensor; the CPU bf16 compute
        type keeps the table in bf16 and widens them)."""
        x = embed_rows(self.embed, tokens)
        return x.to(self._dtype) if x.dtype != self._dtype else x

    def use_bf16_kv(self) -> bool:
        """Keep the KV cache in bf16 (the q8 compute type does; ``keep_quantized(act8=True)``): a
        decode step reads the whole cache, so at long contexts its bytes rival the weights' (SmolLM2
        at 1,200 tokens: 55 MB of fp32 K/V a step beside ~96 MB of q8 weights). New K/V rows are
        rounded to nearest even by both passes (the C pass's ``to_bf16``, torch's cast), attention
        runs in fp32 on the widened values. Only where the C pass can take it (head size % 8 == 0,
        <= 128, its vector attention built), or where it is off. Returns whether it is on."""
        from .. import native

        lib = native.lib()
        ok = (self._dtype == torch.float32 and self.embed.device.type == "cpu"
              and (lib is None or not native.rows_enabled() or bool(lib.llama_rows_kv16_ok(self.cfg.head_dim))))
        if ok and not self.kv_bf16:
            self.kv_bf16 = True
            self.cache = None  # reallocated in bf16 on next use
        return ok

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(*self.kv_dims, capacity, torch.bfloat16 if self.kv_bf16 else self._dtype)

    def describe(self) -> dict[str, Any]:
        c = self.cfg
        return {"family": c.model_type, "layers": c.num_layers, "hidden": c.hidden_size, "heads": f"{c.num_heads}/{c.num_kv_heads}",
                "vocab": c.vocab_size, "dtype": str(self.compute_dtype).replace("torch.", "")}

    # engine/native/llama_rows.c: the whole pass in one C call when every projection is held by
    # linear.c (fp32 blocks, GGUF records or bf16 records). Built on first use; None = the torch
    # pass. Decode steps, verify passes and re-prefilled chains take it (their rows must agree), and
    # so do prefill chunks of any length where its attention runs grouped (``llama_rows_grouped``:
    # GQA, head size a multiple of 8 up to 128): a long prompt's 256-row chunks run 25-47% faster
    # here than in the torch pass with its batched attention GEMMs (2-core Zen 4, 100-1,500 tokens,
    # q8 and bf16: bench/prefill_ab.py --ab native, bench/results/2026-11-27-session24/). Chunks of
    # more than PREFILL_ROWS rows of other models (multi-head attention, where every (row, head)
    # streams its keys alone: a 2k-token prefill 8.4 s against 6.0 in session 8) take the torch pass,
    # as every long chunk did until session 24. Prefill only writes the context's K/V, which every
    # strategy then shares, so the two paths never meet in a comparison.
    _NATIVE_SLOTS = 14

    def _native_table(self) -> torch.Tensor | None:
        tab = self.__dict__.get("_native_tab", False)
        if tab is not False:
            return tab
        from .. import native

        tab = None
        c = self.cfg
        lib = native.lib()
        ok = (lib is not None and native.rows_enabled() and self._dtype == torch.float32 and c.head_dim % 2 == 0
              and self.rope.rot_dim % 2 == 0 and self.embed.device.type == "cpu")
        rows = []
        for L in self.layers if ok else ():
            slots = []
            for key in ("ln1", "ln2"):
                slots.append(L[key].data_ptr() if L[key].is_contiguous() and L[key].dtype == torch.float32 else None)
            for w, b in (("wqkv", "bqkv"), ("wo", "bo"), ("wgu", "bgu"), ("wd", "bd")):
                lin, bias = L[w], L[b]
                held = lin.native_weight() if isinstance(lin, Linear) else None
                if held is None:
                    slots.append(None)
                    break
                slots += [*held, 0 if bias is None else (bias.data_ptr() if bias.is_contiguous() and bias.dtype == torch.float32 else None)]
            if None in slots or len(slots) != self._NATIVE_SLOTS:
                rows = None
                break
            rows.append(slots)
        if ok and rows:
            tab = torch.tensor(rows, dtype=torch.int64)
        self.__dict__["_native_tab"] = tab
        return tab

    def forward_x(self, x: torch.Tensor, positions: torch.Tensor, start: int, mask: torch.Tensor | None) -> torch.Tensor:
        """``forward_rows`` from input rows ``x`` (T, D) instead of token embeddings (a feature head's
        layer, engine/drafters/feature.py): the C pass where it applies, else the torch pass."""
        tab = self._native_table()
        if tab is not None:
            return self._native_rows(tab, x.to(torch.float32, copy=True).contiguous(), positions, start, mask)
        return self._torch_rows(x.to(self._dtype), positions, start, mask)

    def _native_rows(self, tab: torch.Tensor, x: torch.Tensor, positions: torch.Tensor, start: int,
                     mask: torch.Tensor | None) -> torch.Tensor:
        """The C pass over input rows x (T, D): a contiguous fp32 copy the pass writes its residual stream into."""
        from .. import native

        c = self.cfg
        kc, vc = self.cache.k, self.cache.v
        # every pass of this model must take the same path (a row's bits may not depend on the pass)
        kv16 = self.kv_bf16
        assert kc.is_contiguous() and vc.is_contiguous() and kc.dtype == vc.dtype == (torch.bfloat16 if kv16 else torch.float32), "KV cache layout"
        if mask is not None and (mask.stride(1) != 1 or mask.dtype != torch.bool):
            mask = mask.to(torch.bool).contiguous()
        T = x.shape[0]
        cos, sin = self.rope.cos[positions].contiguous(), self.rope.sin[positions].contiguous()
        rc = native.lib().llama_rows_f32(
            x.data_ptr(), T, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, self.rope.rot_dim,
            tab.data_ptr(), tab.shape[0], kc.data_ptr(), vc.data_ptr(), kc.shape[2], start, cos.data_ptr(), sin.data_ptr(),
            None if mask is None else mask.data_ptr(), 0 if mask is None else mask.stride(0), c.rms_norm_eps, self.scale,
            native.threads(), int(kv16))
        if rc:
            raise MemoryError(f"llama_rows_f32 failed ({rc})")
        return rms_norm(x, self.norm, c.rms_norm_eps)

    def _grouped(self) -> bool:
        """The C pass's attention runs grouped for this model (engine/native/llama_rows.c
        ``llama_rows_grouped``): long prefill chunks may take it."""
        g = self.__dict__.get("_grouped_attn")
        if g is None:
            from .. import native

            c = self.cfg
            lib = native.lib()
            g = self.__dict__["_grouped_attn"] = bool(lib is not None and lib.llama_rows_grouped(c.head_dim, c.num_heads // c.num_kv_heads))
        return g

    # engine/native/glue_bf16.c: a bf16 pass on CPU with the operations between its products (norms,
    # rotary and the K/V writes, SiLU, residual adds) in one C call each. Decided once per model: every
    # pass (prefill, decode, verify) then takes it, as a row's bits must not depend on the pass.
    def _glue(self):
        lib = self.__dict__.get("_glue_lib", False)
        if lib is not False:
            return lib
        lib = glue_lib()
        bf = torch.bfloat16
        ok = (lib is not None and self._dtype == bf
              and self.embed.device.type == "cpu" and glue_fits(self.cfg) and self.rope.rot_dim % 2 == 0
              and self.embed.is_contiguous() and self.norm.is_contiguous() and self.norm.dtype == bf
              and self.rope.cos.is_contiguous() and self.rope.sin.is_contiguous()
              and all(L[b] is None for L in self.layers for b in ("bqkv", "bo", "bgu", "bd"))
              and all(L[n].is_contiguous() and L[n].dtype == bf for L in self.layers for n in ("ln1", "ln2")))
        self.__dict__["_glue_lib"] = lib = lib if ok else None
        return lib

    def _glue_rows(self, lib, tokens: torch.Tensor, positions: torch.Tensor, start: int, mask: torch.Tensor | None) -> torch.Tensor:
        from .common import attn_plan, pad_rows

        c = self.cfg
        H, K, E, D, Fi = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size, c.intermediate_size
        T = tokens.shape[0]
        R = self.rope.rot_dim
        kc, vc = self.cache.k, self.cache.v
        P = kc.shape[2]
        bf = torch.bfloat16
        Tp = max(T, pad_rows(bf))  # the products' rows: a small pass runs padded (zero rows, discarded)
        assert kc.is_contiguous() and vc.is_contiguous() and kc.dtype == vc.dtype == bf, "KV cache layout"
        x = embed_rows(self.embed, tokens)  # (T, D) the residual stream, a copy
        h = torch.zeros(Tp, D, dtype=bf)  # the normed rows the next product takes
        att = torch.zeros(Tp, H * E, dtype=bf)
        act = torch.zeros(Tp, Fi, dtype=bf)
        cos, sin = self.rope.cos[positions].contiguous(), self.rope.sin[positions].contiguous()
        plan = attn_plan(mask, start + T, T, H // K)
        np_ = plan.native
        eps, xp, hp = c.rms_norm_eps, x.data_ptr(), h.data_ptr()
        lib.bf16_add_rmsnorm(xp, D, None, 0, T, D, self.layers[0]["ln1"].data_ptr(), eps, hp, D)
        for i, L in enumerate(self.layers):
            qkv = L["wqkv"](h)  # (Tp, (H + 2K) E)
            if lib.bf16_rope_kv(qkv.data_ptr(), qkv.stride(0), T, H, K, E, R, cos.data_ptr(), sin.data_ptr(), R,
                                kc[i].data_ptr(), vc[i].data_ptr(), P, start):
                raise RuntimeError(f"bf16_rope_kv refused the shape (E {E}, rotary {R})")
            if np_ is not None:
                rc = np_.lib.attn_rows_bf16(
                    qkv.data_ptr(), E, qkv.stride(0), kc[i].data_ptr(), vc[i].data_ptr(), P, K, H // K, E,
                    np_.lead.data_ptr(), 0 if np_.tail is None else np_.tail.data_ptr(),
                    0 if np_.ntail is None else np_.ntail.data_ptr(), np_.stride, self.scale, att.data_ptr(), 0, T)
                if rc:
                    raise MemoryError("attention scratch allocation failed")
            else:  # the torch attention (common.NATIVE_ATTN off): the same rows (written again: the same values)
                qk = qkv[:T, :(H + 2 * K) * E].view(T, H + 2 * K, E).transpose(0, 1)
                att[:T] = cached_attention(qk[:H], qk[H:H + K], qk[H + K:], kc[i], vc[i], start, mask, self.scale, plan)
            a = L["wo"](att)
            lib.bf16_add_rmsnorm(xp, D, a.data_ptr(), a.stride(0), T, D, L["ln2"].data_ptr(), eps, hp, D)
            gu = L["wgu"](h)
            lib.bf16_silu_mul(gu.data_ptr(), gu.stride(0), T, Fi, act.data_ptr(), Fi)
            m = L["wd"](act)
            nxt = self.layers[i + 1]["ln1"] if i + 1 < len(self.layers) else self.norm
            lib.bf16_add_rmsnorm(xp, D, m.data_ptr(), m.stride(0), T, D, nxt.data_ptr(), eps, hp, D)
        return h[:T]

    def forward_rows(self, tokens: torch.Tensor, positions: torch.Tensor, start: int, mask: torch.Tensor | None) -> torch.Tensor:
        tab = self._native_table()
        if tab is not None and (not (self._prefilling and tokens.shape[0] > PREFILL_ROWS) or (NATIVE_LONG_PREFILL and self._grouped())):
            return self._native_rows(tab, self._embed_rows(tokens).contiguous(), positions, start, mask)  # (a copy)
        glue = self._glue() if self._dtype == torch.bfloat16 else None
        if glue is not None:
            return self._glue_rows(glue, tokens, positions, start, mask)
        return self._torch_rows(self._embed_rows(tokens), positions, start, mask)

    def _torch_rows(self, x: torch.Tensor, positions: torch.Tensor, start: int, mask: torch.Tensor | None) -> torch.Tensor:
        """The torch pass from input rows x (T, D)."""
        c = self.cfg
        H, K, E = c.num_heads, c.num_kv_heads, c.head_dim
        T = x.shape[0]
        kc, vc = self.cache.k, self.cache.v
        # shared by every layer: the rotary tables of these positions and the attention's key plan
        cos, sin = self.rope.cos[positions], self.rope.sin[positions]
        plan = attn_plan(mask, start + T, T, H // K) if self._dtype == torch.bfloat16 else None
        # a long fp32 prefill chunk: the mask as an additive bias, folded into the score GEMM
        bias = (prefill_bias(mask, H // K) if PREFILL_ATTENTION and self._prefilling and T > PREFILL_ROWS
                and mask is not None and self._dtype == torch.float32 else None)
        for i, L in enumerate(self.layers):
            h = rms_norm(x, L["ln1"], c.rms_norm_eps)
            qkv = mm(h, L["wqkv"])
            if L["bqkv"] is not None:
                qkv = qkv + L["bqkv"]
            qk = self.rope.rotate(qkv[:, :(H + K) * E].view(T, H + K, E).transpose(0, 1), cos, sin)  # q and k heads at once
            q, k = qk[:H], qk[H:]  # (H, T, E), (K, T, E)
            v = qkv[:, (H + K) * E:].view(T, K, E).transpose(0, 1)
            if bias is not None:
                a = mm(prefill_attention(q, k, v, kc[i], vc[i], start, bias, self.scale), L["wo"])
            else:
                a = mm(cached_attention(q, k, v, kc[i], vc[i], start, mask, self.scale, plan), L["wo"])
            if L["bo"] is not None:
                a = a + L["bo"]
            x = x + a
            x = x + self._mlp(L, rms_norm(x, L["ln2"], c.rms_norm_eps))
        return rms_norm(x, self.norm, c.rms_norm_eps)

    @staticmethod
    def _mlp(L: dict, h: torch.Tensor) -> torch.Tensor:
        gu = mm(h, L["wgu"])
        if L["bgu"] is not None:
            gu = gu + L["bgu"]
        g, u = gu.chunk(2, dim=-1)
        m = mm(F.silu(g) * u, L["wd"])
        return m + L["bd"] if L["bd"] is not None else m

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return mm(hidden, self.lm_head_t)  # (T, V)

    def forward_batch(self, tokens: torch.Tensor, positions: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                      start: int, key_ok: torch.Tensor) -> torch.Tensor:
        """Batched rows for offline generation (``specchat distill data``), outside the tree cache.

        tokens, positions (B, T); k_buf, v_buf (layers, B, K, P, E) written at columns
        [start, start + T); key_ok (B, start + T) marks real (non-padding) key columns. Queries
        attend causally to valid keys. Returns final-norm hidden states (B, T, D).
        """
        c = self.cfg
        H, K, E = c.num_heads, c.num_kv_heads, c.head_dim
        G = H // K
        B, T = tokens.shape
        end = start + T
        x = self._embed_rows(tokens)  # (B, T, D)
        cos = self.rope.cos[positions].unsqueeze(1)  # (B, 1, T, R)
        sin = self.rope.sin[positions].unsqueeze(1)
        r = self.rope.rot_dim

        def rot(t: torch.Tensor) -> torch.Tensor:
            if r == t.shape[-1]:
                return t * cos + rotate_half(t) * sin
            return torch.cat([t[..., :r] * cos + rotate_half(t[..., :r]) * sin, t[..., r:]], dim=-1)

        dev = x.device
        causal = torch.ones(T, end, dtype=torch.bool, device=dev).tril(start)  # query t sees keys <= start + t
        own = torch.zeros(T, end, dtype=torch.bool, device=dev)
        own[:, start:] = torch.eye(T, dtype=torch.bool, device=dev)
        # padding queries see only themselves: no all-masked row, so no NaN reaches real rows' values
        allowed = ((causal.unsqueeze(0) & key_ok[:, None, :end]) | own).unsqueeze(1)  # (B, 1, T, L)
        for i, L in enumerate(self.layers):
            h = rms_norm(x, L["ln1"], c.rms_norm_eps)
            qkv = h @ L["wqkv"]
            if L["bqkv"] is not None:
                qkv = qkv + L["bqkv"]
            q = rot(qkv[..., : H * E].view(B, T, H, E).transpose(1, 2))  # (B, H, T, E)
            k = rot(qkv[..., H * E:(H + K) * E].view(B, T, K, E).transpose(1, 2))
            v = qkv[..., (H + K) * E:].view(B, T, K, E).transpose(1, 2)
            k_buf[i, :, :, start:end] = k
            v_buf[i, :, :, start:end] = v
            qg = q.reshape(B, K, G * T, E)
            scores = torch.matmul(qg, k_buf[i, :, :, :end].transpose(-1, -2)).float() * self.scale  # (B, K, G*T, L)
            scores.masked_fill_(~allowed.repeat(1, 1, G, 1), float("-inf"))
            out = torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v_buf[i, :, :, :end])  # (B, K, G*T, E)
            a = out.reshape(B, H, T, E).transpose(1, 2).reshape(B, T, H * E) @ L["wo"]
            if L["bo"] is not None:
                a = a + L["bo"]
            x = x + a
            x = x + self._mlp(L, rms_norm(x, L["ln2"], c.rms_norm_eps))
        return rms_norm(x, self.norm, c.rms_norm_eps)
