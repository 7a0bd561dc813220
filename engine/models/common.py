"""Pieces shared by the attention families: RoPE (with the HF scaling variants) and cached attention.

Shape letters: T new rows (tokens/tree nodes) this call, L = cache rows attended (committed +
scratch), D model width, H query heads, K kv heads, G = H / K, E head dim, V vocabulary.
Batch is 1 throughout: trees are packed along T, not along a batch axis.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
import time
from typing import Any

import torch

from ..errors import ModelLoadError


# ---------------------------------------------------------------------------------------------
# Config helpers
# ---------------------------------------------------------------------------------------------
def rope_params(cfg: dict[str, Any]) -> dict[str, Any]:
    """Normalise RoPE fields across transformers 4.x (rope_theta + rope_scaling, rotary_pct,
    rotary_emb_base) and 5.x (rope_parameters) configs into one dict."""
    rp = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    for k, v in scaling.items():
        rp.setdefault(k, v)
    if "type" in rp and "rope_type" not in rp:
        rp["rope_type"] = rp.pop("type")
    rp.setdefault("rope_type", "default")
    rp.setdefault("rope_theta", cfg.get("rope_theta", cfg.get("rotary_emb_base", 10000.0)))
    rp.setdefault("partial_rotary_factor", cfg.get("partial_rotary_factor", cfg.get("rotary_pct", 1.0)))
    return rp


def require(cfg: dict[str, Any], key: str, where: str, positive: bool = True) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ModelLoadError(f"{where}: config.json lacks required field {key!r}")
    val = cfg[key]
    if positive and (not isinstance(val, (int, float)) or isinstance(val, bool) or val <= 0 or val > 10_000_000):
        raise ModelLoadError(f"{where}: config field {key!r} has an absurd value {val!r}")
    return val


def tensor_getter(sd: dict[str, torch.Tensor], family: str):
    """get(name, shape=None): the checkpoint tensor ``name``, or a ModelLoadError naming what is
    missing or misshapen (every family loads its weights through one of these)."""
    def get(name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        t = sd.get(name)
        if t is None:
            raise ModelLoadError(f"{family} checkpoint lacks tensor {name!r} (not a {family} checkpoint, or incomplete)")
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ModelLoadError(f"tensor {name} has shape {tuple(t.shape)}, config implies {tuple(shape)}")
        return t
    return get


# ---------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------
def rope_inv_freq(rot_dim: int, rp: dict[str, Any], max_pos: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [rot_dim/2] and the attention scaling factor for a rope_type.

    Supported: default, linear, dynamic (NTK; default frequencies within the original length,
    see context_limit), llama3, yarn — the formulas of transformers' modeling_rope_utils, re-derived.
    """
    base = float(rp["rope_theta"])
    kind = rp.get("rope_type", "default")
    idx = torch.arange(0, rot_dim, 2, dtype=torch.float64)
    inv = 1.0 / (base ** (idx / rot_dim))
    attn_factor = 1.0
    if kind == "default":
        pass
    elif kind == "linear":
        inv = inv / float(rp["factor"])
    elif kind == "dynamic":
        # transformers stretches the base only once a sequence outgrows the original length, so
        # below it the frequencies are the default ones; context_limit() caps us there.
        pass
    elif kind == "llama3":
        factor = float(rp["factor"])
        low, high = float(rp["low_freq_factor"]), float(rp["high_freq_factor"])
        orig = float(rp["original_max_position_embeddings"])
        low_wl, high_wl = orig / low, orig / high
        wl = 2 * math.pi / inv
        scaled = torch.where(wl > low_wl, inv / factor, inv)
        smooth = (orig / wl - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wl >= high_wl) & (wl <= low_wl)
        inv = torch.where(is_mid, mid, scaled)
    elif kind == "yarn":
        factor = float(rp["factor"])
        orig = int(rp.get("original_max_position_embeddings", max_pos))
        beta_fast, beta_slow = float(rp.get("beta_fast", 32)), float(rp.get("beta_slow", 1))
        mscale = rp.get("mscale", 1.0)

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attn_factor = float(rp.get("attention_factor") or get_mscale(factor, mscale))

        def corr_dim(n_rot: float) -> float:
            return (rot_dim * math.log(orig / (n_rot * 2 * math.pi))) / (2 * math.log(base))

        lo = corr_dim(beta_fast)
        hi = corr_dim(beta_slow)
        if rp.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, rot_dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(rot_dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        extra_mask = 1 - ramp
        inv = (inv / factor) * (1 - extra_mask) + inv * extra_mask
    else:
        raise ModelLoadError(f"rope_type {kind!r} is not supported (default, linear, dynamic, llama3, yarn)")
    return inv.float(), attn_factor


def context_limit(rp: dict[str, Any], max_pos: int, sliding_window: int | None = None) -> int:
    """The longest context we reproduce exactly: dynamic-NTK RoPE changes with the sequence length
    past its original length, and a sliding-window model attends to only the last W tokens; we
    do neither, so the context stops where both still agree with the reference."""
    limit = max_pos
    if rp.get("rope_type") == "dynamic":
        limit = min(limit, int(rp.get("original_max_position_embeddings", max_pos)))
    if sliding_window:
        limit = min(limit, int(sliding_window))
    return limit


class Rope:
    """cos/sin tables for positions [0, max_pos), applied in the rotate-half layout (HF/NeoX)."""

    def __init__(self, rot_dim: int, rp: dict[str, Any], max_pos: int, dtype: torch.dtype,
                 device: torch.device | None = None):
        inv, attn_factor = rope_inv_freq(rot_dim, rp, max_pos)
        t = torch.arange(max_pos, dtype=torch.float32)
        freqs = torch.outer(t, inv)  # (P, E_rot/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # computed on the CPU (the same tables everywhere), then moved
        self.cos = (emb.cos() * attn_factor).to(dtype=dtype, device=device)
        self.sin = (emb.sin() * attn_factor).to(dtype=dtype, device=device)
        self.rot_dim = rot_dim

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (N, T, E) -> rotated (only the first rot_dim features of each head)."""
        return self.rotate(x, self.cos[positions], self.sin[positions])

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``apply`` with the (T, R) tables of the positions already gathered (once per pass)."""
        r = self.rot_dim
        if r == x.shape[-1]:
            return x * cos + rotate_half(x) * sin
        xr, xp = x[..., :r], x[..., r:]
        return torch.cat([xr * cos + rotate_half(xr) * sin, xp], dim=-1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


# ---------------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------------
def embed_rows(table: torch.Tensor, ids: torch.Tensor | Any) -> torch.Tensor:
    """``table[ids]`` (a new tensor of the same values) through ``index_select``. Advanced indexing
    runs torch's TensorIterator index kernel, which opens an OpenMP region from 6 rows of a 576-wide
    table: the woken team then contends with the C passes' own thread pool for the two cores, and a
    6-row bf16 verify of SmolLM2 took 7.6 ms against 5.8 for 5 rows (~1.8 ms for a 7 us gather);
    through ``index_select`` 6 rows took 6.0 ms and the curve had no step (2-core Xeon with AMX,
    session 45, bench/results/2026-12-07-session45/)."""
    idx = torch.as_tensor(ids, dtype=torch.long, device=table.device)
    if idx.dim() == 1:
        return torch.index_select(table, 0, idx)
    return torch.index_select(table, 0, idx.reshape(-1)).view(*idx.shape, table.shape[-1])


# ---------------------------------------------------------------------------------------------
# Norms
# ---------------------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in fp32 (as HF does) so bf16 activations keep their accuracy.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


# ---------------------------------------------------------------------------------------------
# Attention over the KV cache
# ---------------------------------------------------------------------------------------------
def cached_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
    mask: torch.Tensor | None,
    scale: float,
    plan: AttnPlan | None = None,
) -> torch.Tensor:
    """Write the new K/V at cache rows [start, start + T) and attend over rows [0, start + T).

    q (H, T, E); k_new, v_new (K, T, E); k_cache, v_cache (K, P, E); mask (T, L) bool or None
    (None = every row sees every cached row, the single-token decode case). Returns (T, H*E).
    GQA without repeating K/V: the G query heads of one kv head are stacked along the row axis.
    ``plan``: bf16 only, ``attn_plan(mask, start + T, T, G)`` made once per forward pass and
    shared by its layers (made here when omitted).
    """
    H, T, E = q.shape
    K = k_new.shape[0]
    G = H // K
    end = start + T
    k_cache[:, start:end] = k_new
    v_cache[:, start:end] = v_new
    if q.dtype == torch.bfloat16:
        plan = plan or attn_plan(mask, end, T, G)
        if plan.native is not None and E % 16 == 0 and q.stride(-1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous():
            return _native_attention(plan.native, q, k_cache, v_cache, plan, scale)
        if plan.native is not None:  # a shape the kernel does not take: the torch plan instead
            plan = attn_plan(mask, end, T, G, native=False)
        qg = q.reshape(K, G * T, E)  # head h = k*G + g -> rows g*T + t of group k
        out = blockwise_attention(qg, k_cache, v_cache, plan, scale)
        return out.reshape(H, T, E).transpose(0, 1).reshape(T, H * E)
    qg = q.reshape(K, G * T, E)
    k, v = _widened_kv(k_cache, v_cache, end, q.dtype)
    # Explicit softmax attention: at these sizes (T <= a few hundred rows, L <= a few thousand)
    # torch's CPU SDPA kernel costs ~0.3-7 ms of fixed overhead per call vs ~30 us for this.
    scores = torch.matmul(qg, k.transpose(1, 2)).float() * scale  # (K, G*T, L)
    if mask is not None:
        scores.masked_fill_(~mask.repeat(G, 1), float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)  # (K, G*T, E)
    return out.reshape(H, T, E).transpose(0, 1).reshape(T, H * E)


PREFILL_ROW_BLOCK = 64  # prefill_attention's rows per score GEMM


def prefill_bias(mask: torch.Tensor, G: int) -> list[torch.Tensor]:
    """The additive form of ``mask`` (T, L) bool for :func:`prefill_attention`, made once per pass
    and shared by its layers: per block of PREFILL_ROW_BLOCK rows [r0, r1), the (G*rows, L - T + r1)
    fp32 bias of those rows over the keys they can see (0 where a row sees a key, -inf elsewhere),
    repeated for the G query heads of a KV head, laid out as the score GEMM takes it."""
    T, L = mask.shape
    bias = torch.zeros(mask.shape, dtype=torch.float32).masked_fill_(~mask, float("-inf"))
    return [bias[r0:min(T, r0 + PREFILL_ROW_BLOCK), :L - T + min(T, r0 + PREFILL_ROW_BLOCK)].repeat(G, 1)
            for r0 in range(0, T, PREFILL_ROW_BLOCK)]


def _widened_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, end: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache rows [0, end) in ``dtype``: fp32 rows over a bf16 cache (the q8 compute type) attend on
    the widened values."""
    k, v = k_cache[:, :end], v_cache[:, :end]
    return (k.to(dtype), v.to(dtype)) if k.dtype != dtype else (k, v)


def prefill_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
    bias: list[torch.Tensor],
    scale: float,
) -> torch.Tensor:
    """:func:`cached_attention` for a long fp32 prefill chunk in the torch pass (the q8 and fp32
    compute types where a long chunk does not take the C pass: no kernels, SPECCHAT_NATIVE_ROWS=0,
    multi-head attention models, llama.NATIVE_LONG_PREFILL off), with
    the scale and the mask folded into the score GEMM (``baddbmm(bias, q, k^T, alpha=scale)``, the
    row blocks' biases from :func:`prefill_bias`): no per-layer mask repeat, inversion, fill or
    scaling pass. Rows in blocks: block [r0, r1) attends keys [0, start + r1) only, skipping most
    of the causal triangle's masked scores (half the work of a first chunk).

    Its rows' bits may differ from ``cached_attention``'s, so only prefill chunks longer than any
    verify pass or re-prefilled chain take it (models/llama.py PREFILL_ROWS): it writes the
    context's K/V, which every strategy then shares.
    """
    H, T, E = q.shape
    K = k_new.shape[0]
    G = H // K
    k_cache[:, start:start + T] = k_new
    v_cache[:, start:start + T] = v_new
    k, v = _widened_kv(k_cache, v_cache, start + T, q.dtype)
    qg = q.reshape(K, G, T, E)
    kt = k.transpose(1, 2)
    out = torch.empty(K, G, T, E, dtype=q.dtype)
    for r0, b in zip(range(0, T, PREFILL_ROW_BLOCK), bias):
        r1, L = min(T, r0 + PREFILL_ROW_BLOCK), b.shape[1]
        scores = torch.baddbmm(b, qg[:, :, r0:r1].reshape(K, G * (r1 - r0), E), kt[:, :, :L], alpha=scale)  # (K, G*rows, L)
        out[:, :, r0:r1] = torch.matmul(torch.softmax(scores, dim=-1), v[:, :L]).view(K, G, r1 - r0, E)
    return out.reshape(H, T, E).transpose(0, 1).reshape(T, H * E)


ATTN_BLOCK = 64  # keys per block of the bf16 attention's fixed reduction order


NATIVE_ATTN = True  # use engine/native's attention kernel for bf16 when it builds (tests switch it)


class NativePlan:
    """The same key layout as the C kernel takes it: row t sees keys [0, lead[t]) then
    tail[t, :ntail[t]] (int32, contiguous)."""

    __slots__ = ("lead", "lib", "ntail", "stride", "tail")

    def __init__(self, lib, lead: torch.Tensor, tail: torch.Tensor | None, ntail: torch.Tensor | None):
        self.lib, self.lead, self.tail, self.ntail = lib, lead, tail, ntail
        self.stride = 0 if tail is None else tail.shape[1]


def _native_plan(mask: torch.Tensor | None, end: int, T: int):
    from .. import native

    lib = native.lib() if NATIVE_ATTN else None
    if lib is None:
        return None
    if mask is None:
        return NativePlan(lib, torch.full((T,), end, dtype=torch.int32), None, None)
    lead = mask.int().cumprod(dim=-1).sum(-1)  # leading visible keys per row
    rest = mask & (torch.arange(mask.shape[1])[None, :] >= lead[:, None])  # visible keys after the lead: tree ancestors
    r, c = torch.nonzero(rest).unbind(1)
    if r.numel() == 0:
        return NativePlan(lib, lead.to(torch.int32), None, None)
    counts = torch.bincount(r, minlength=T)
    first = torch.cumsum(counts, 0) - counts
    tail = torch.zeros(T, int(counts.max()), dtype=torch.int32)
    tail[r, torch.arange(r.numel()) - first[r]] = c.to(torch.int32)
    return NativePlan(lib, lead.to(torch.int32), tail, counts.to(torch.int32))


def _native_attention(np_: NativePlan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      plan: AttnPlan, scale: float) -> torch.Tensor:
    H, T, E = q.shape
    K, P, _ = k_cache.shape
    G = H // K
    out = torch.empty(T, H * E, dtype=q.dtype)
    rc = np_.lib.attn_rows_bf16(
        q.data_ptr(), q.stride(0), q.stride(1), k_cache.data_ptr(), v_cache.data_ptr(), P, K, G, E,
        np_.lead.data_ptr(), 0 if np_.tail is None else np_.tail.data_ptr(),
        0 if np_.ntail is None else np_.ntail.data_ptr(), np_.stride, scale, out.data_ptr(), 0, T)
    if rc != 0:
        raise MemoryError("attention scratch allocation failed")
    return out


class AttnPlan:
    """Which keys each row of one forward pass sees, laid out in ``blockwise_attention``'s blocks.
    It depends only on the mask, so a pass makes it once and every layer reuses it (per layer it
    cost ~20 small ops, and a python loop over the rows for trees).

    nb: blocks read in place from the cache (keys [0, nb*B)); invalid: (G*T, nb*B) bool of keys a
    row must not see among them, or None when it sees them all; nt: per-row tail blocks; idx
    (T*nt*B,) the cache rows of every row's tail keys; tinvalid (G*T, nt*B) their padding.
    """

    __slots__ = ("G", "T", "idx", "invalid", "native", "nb", "nt", "tinvalid")

    def __init__(self, T: int, G: int, nb: int, invalid: torch.Tensor | None, nt: int = 0,
                 idx: torch.Tensor | None = None, tinvalid: torch.Tensor | None = None, native: NativePlan | None = None):
        self.T, self.G, self.nb, self.invalid = T, G, nb, invalid
        self.nt, self.idx, self.tinvalid = nt, idx, tinvalid
        self.native = native


def attn_plan(mask: torch.Tensor | None, end: int, T: int, G: int, native: bool = True) -> AttnPlan:
    """The AttnPlan of T rows over keys [0, end) under ``mask`` (T, end) bool, or None: all keys.
    With the native kernel (engine/native) only its key lists are made."""
    if native and G <= 64:
        nat = _native_plan(mask, end, T)
        if nat is not None:
            return AttnPlan(T, G, 0, None, native=nat)
    B = ATTN_BLOCK
    if mask is None:
        lens = None
        gaps = False
    else:
        lead = mask.int().cumprod(dim=-1).sum(-1)  # leading visible keys per row
        lens = mask.sum(-1)
        gaps = bool((lead != lens).any())
    if not gaps:
        # every row sees a contiguous prefix of the keys: blocks straight from the cache
        nb = -(-end // B)
        pos = torch.arange(nb * B)
        if lens is None or bool((lens == end).all()):
            invalid = None if nb * B == end else (pos >= end)[None, :].expand(G * T, -1)
        else:
            invalid = (pos[None, :] >= lens[:, None]).repeat(G, 1)  # (G*T, nb*B)
        return AttnPlan(T, G, nb, invalid)
    shared = int(lead.min()) // B  # full blocks every row sees in place
    Bf = shared * B
    tails = [torch.nonzero(mask[t]).flatten()[Bf:] for t in range(T)]
    nt = max(-(-len(x) // B) for x in tails)
    idx = torch.zeros(T, nt * B, dtype=torch.long)
    tvalid = torch.zeros(T, nt * B, dtype=torch.bool)
    for t, x in enumerate(tails):
        idx[t, :len(x)] = x
        tvalid[t, :len(x)] = True
    return AttnPlan(T, G, shared, None, nt, idx.flatten(), (~tvalid).repeat(G, 1))


def blockwise_attention(qg: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttnPlan,
                        scale: float) -> torch.Tensor:
    """Softmax attention whose every row is computed in the same order whatever the other rows
    are: bit-identical for one decode row, a chain verify, a tree row and a prefill row that see
    the same keys. bf16 needs it (lossless means greedy SD == greedy AR in the chosen dtype).

    A row's keys are taken in its own logical order (the committed prefix, then its ancestors)
    and reduced in blocks of ATTN_BLOCK logical positions: exp-sums and value sums per block
    (fixed shapes), then added block after block (cumsum: a fixed sequential order). Masked keys
    *between* visible ones (a tree row's siblings) would shift a plain reduction's vector lanes
    and round differently; here they never enter a block. Blocks entirely below the rows' common
    contiguous prefix are read from the cache in place (shared by all rows); only the tail blocks
    of tree rows with gaps are gathered (at most ATTN_BLOCK + depth keys per row).

    qg (K, G*T, E) bf16; k_cache, v_cache (K, P, E); ``plan`` from ``attn_plan``. Returns
    (K, G*T, E) in qg's dtype.
    """
    K, _, E = qg.shape
    B = ATTN_BLOCK
    kb, vb = _padded(k_cache, plan.nb * B), _padded(v_cache, plan.nb * B)
    kt = vt = None
    if plan.nt:
        T = plan.T
        kt = k_cache[:, plan.idx].view(K, T, plan.nt * B, E)  # (K, T, nt*B, E): each row's tail, gathered
        vt = v_cache[:, plan.idx].view(K, T, plan.nt * B, E)
    return _blocks(qg, kb, vb, plan.invalid, scale, plan.nb, plan.nt, kt, vt, plan.tinvalid)


def _padded(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[:, :n], zero-padded when the cache is shorter than n (the pad is masked out)."""
    if x.shape[1] >= n:
        return x[:, :n]
    return torch.cat([x, x.new_zeros(x.shape[0], n - x.shape[1], x.shape[2])], dim=1)


def _mm_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with at least two rows per product (a single bf16 row takes a GEMV path that rounds
    differently; see ``mm``)."""
    if a.shape[-2] == 1:
        return torch.matmul(torch.cat([a, a], dim=-2), b)[..., :1, :]
    return torch.matmul(a, b)


def _blocks(qg, kb, vb, invalid, scale, nb, nt, kt, vt, tinvalid) -> torch.Tensor:
    """The block reduction of ``blockwise_attention``: ``nb`` shared blocks (kb, vb: (K, nb*B, E),
    invalid (R, nb*B) or None) then ``nt`` per-row tail blocks (kt, vt: (K, T, nt*B, E), tinvalid
    (R, nt*B))."""
    K, R, E = qg.shape
    B = ATTN_BLOCK
    parts_s = []
    if nb:
        s = _mm_rows(qg, kb.transpose(1, 2)).float() * scale  # (K, R, nb*B)
        parts_s.append(s if invalid is None else s.masked_fill_(invalid, float("-inf")))
    if nt:
        T = kt.shape[1]
        G = R // T
        qt = qg.view(K, G, T, E).transpose(1, 2)  # (K, T, G, E): a row's G heads against its own tail
        st = _mm_rows(qt, kt.transpose(2, 3)).float() * scale  # (K, T, G, nt*B)
        st = st.transpose(1, 2).reshape(K, R, nt * B)
        parts_s.append(st.masked_fill_(tinvalid, float("-inf")))
    s = parts_s[0] if len(parts_s) == 1 else torch.cat(parts_s, dim=-1)  # (K, R, (nb+nt)*B)
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    nblk = nb + nt
    eb = e.view(K, R, nblk, B)
    total = eb.sum(-1).cumsum(-1)[..., -1:]  # block sums, added in block order
    # probabilities in the values' dtype, as a plain bf16 attention does: bf16 GEMMs give every
    # row the same bits whatever the row count (fp32 GEMMs do not: measured, M = 3 vs 138)
    p = (eb / total[..., None]).to(vb.dtype)  # (K, R, nblk, B)
    outs = []
    if nb:
        ps = p[:, :, :nb].permute(0, 2, 1, 3)  # (K, nb, R, B)
        outs.append(_mm_rows(ps, vb.view(K, nb, B, E)))  # (K, nb, R, E)
    if nt:
        T = kt.shape[1]
        G = R // T
        pt = p[:, :, nb:].reshape(K, G, T, nt, B).permute(0, 2, 3, 1, 4)  # (K, T, nt, G, B)
        ot = _mm_rows(pt, vt.view(K, T, nt, B, E))  # (K, T, nt, G, E)
        outs.append(ot.permute(0, 2, 3, 1, 4).reshape(K, nt, R, E))
    o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # (K, nblk, R, E)
    return o.float().cumsum(1)[:, -1].to(qg.dtype)  # blocks added in order, in fp32


def _packable() -> bool:
    return bool(torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
                and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


# oneDNN's pre-packed linear weights (CPU builds with mkldnn); SPECCHAT_PACKED=0 turns them off
PACKED = _packable() and os.environ.get("SPECCHAT_PACKED", "1").strip().lower() not in ("0", "off", "false", "no")
_PACK_OK: dict[torch.dtype, bool] = {}


def packs(dtype: torch.dtype) -> bool:
    """Whether this CPU packs ``dtype`` weights: oneDNN's bf16 reorder needs AVX-512 (bw, vl, dq)
    or AVX-NE-CONVERT and raises on a plain AVX2 CPU (an AMD EPYC 7003, say), so each dtype is
    tried once on a small weight and falls back to the plain layout where it fails."""
    if not PACKED or dtype not in (torch.float32, torch.bfloat16):
        return False
    ok = _PACK_OK.get(dtype)
    if ok is None:
        try:
            w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(8, 16, dtype=dtype), 1)
            y = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 16, dtype=dtype), w, None, "none", [], "")
            ok = bool(y.shape == (2, 8) and float(y[0, 0]) == 16.0)
        except RuntimeError:
            ok = False
        _PACK_OK[dtype] = ok
    return ok


# Drafter numerics (``fast_rows``): a drafter's numbers only choose what is proposed, and
# verification alone decides what is emitted, so a drafter need not keep ``mm``'s guarantee that a
# row's bits do not depend on how many rows go together. Under ``fast_rows`` a single-row product
# takes whichever of the row-consistent path and a plain GEMV measured faster for that weight on
# this CPU (Linear.__call__). ``exact_rows`` restores the guarantee inside it (SLRS computes the
# drafter's q twice, once while drafting and once for psi, and both must be the same numbers).
_ROWS: contextvars.ContextVar[str | None] = contextvars.ContextVar("specchat_rows", default=None)


@contextlib.contextmanager
def fast_rows():
    """Drafter numerics for the calls inside (unless an enclosing ``exact_rows`` holds)."""
    token = _ROWS.set("fast") if _ROWS.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _ROWS.reset(token)


@contextlib.contextmanager
def exact_rows():
    """Row-consistent products inside, whatever encloses it."""
    token = _ROWS.set("exact")
    try:
        yield
    finally:
        _ROWS.reset(token)


def rows_fast() -> bool:
    """Inside ``fast_rows`` (and no ``exact_rows`` within it): a drafter's call."""
    return _ROWS.get() == "fast"


def drafter_numerics(fn):
    """Decorator: ``fn`` runs under ``fast_rows``."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with fast_rows():
            return fn(*args, **kwargs)
    return wrapped


# engine/native/linear.c: row-consistent fp32 products (every output one FMA chain over the input
# in order, for any number of rows). Where it measures faster than oneDNN's packed GEMM
# (``native_linear``), fp32 weights are kept only in its layout and every pass uses it: decode
# steps, verify passes, prefill chunks, drafting. SPECCHAT_NATIVE_LINEAR=0/1 forces it off/on.
_NATIVE_LINEAR: dict[str, object] = {}


_FOR_DRAFTING: contextvars.ContextVar[bool] = contextvars.ContextVar("specchat_for_drafting", default=False)


@contextlib.contextmanager
def loading_a_drafter():
    """Inside (engine.session loading a drafter model): fp32 weights take linear.c wherever the
    kernels load, whatever ``native_linear`` measured for targets. A drafter's C path (Q8_0 records,
    a quarter of the bytes, and the Mamba-2 step in one C call a block) is its fast path; the
    target's measure, taken beside torch's spinning OpenMP threads in a bf16 session, once found
    the C product slower at 8 rows and left the shipped drafter in fp32 oneDNN: its 16,941-row head
    then read 32 MB a token and sd:5 ran at 1.07x plain decoding instead of ~1.8x."""
    token = _FOR_DRAFTING.set(True)
    try:
        yield
    finally:
        _FOR_DRAFTING.reset(token)


def native_linear() -> bool:
    """Whether fp32 weights take engine/native/linear.c: measured once per process on a
    SmolLM2-sized MLP weight (576 x 1536) at 1 and 8 rows against the packed oneDNN product; kept
    where it is >= 10% faster at one row and at most 25% slower at eight (decode steps are one row,
    chain verify passes a few). The reason is in
    ``native_linear_status()``. Loading a drafter (``loading_a_drafter``): on wherever the kernels
    load and SPECCHAT_NATIVE_LINEAR is not 0."""
    if _FOR_DRAFTING.get():
        from .. import native

        env = os.environ.get("SPECCHAT_NATIVE_LINEAR", "auto").strip().lower()
        return native.lib() is not None and env not in ("0", "off", "false", "no")
    if "on" in _NATIVE_LINEAR:
        return bool(_NATIVE_LINEAR["on"])
    from .. import native

    env = os.environ.get("SPECCHAT_NATIVE_LINEAR", "auto").strip().lower()
    lib = native.lib()
    if lib is None or env in ("0", "off", "false", "no"):
        _NATIVE_LINEAR.update(on=False, why="off" if lib is not None else f"native kernels {native.status()}")
        return False
    if env in ("1", "on", "true", "yes"):
        _NATIVE_LINEAR.update(on=True, why="on (SPECCHAT_NATIVE_LINEAR=1)")
        return True
    g = torch.Generator().manual_seed(0)
    W = torch.randn(1536, 576, generator=g)
    nat = Linear(W, torch.float32, pack=packs(torch.float32), native=True)
    ref = Linear(W, torch.float32, pack=packs(torch.float32), native=False)
    x1, x8 = torch.randn(1, 576, generator=g), torch.randn(8, 576, generator=g)
    t = {(k, r): _best_of(lambda: lin(x), reps=15) for k, lin in (("native", nat), ("ref", ref)) for r, x in ((1, x1), (8, x8))}
    on = t["native", 1] < 0.9 * t["ref", 1] and t["native", 8] <= 1.25 * t["ref", 8]
    _NATIVE_LINEAR.update(on=on, why=f"{'on' if on else 'off'}: 576x1536 fp32, 1 row {t['native', 1] * 1e6:.0f} vs "
                                     f"{t['ref', 1] * 1e6:.0f} us, 8 rows {t['native', 8] * 1e6:.0f} vs {t['ref', 8] * 1e6:.0f} us (oneDNN)")
    return on


def native_linear_status() -> str:
    native_linear()
    return str(_NATIVE_LINEAR["why"])


def _blocks16(w: torch.Tensor) -> torch.Tensor:
    """[out, in] fp32 -> linear.c's layout (nb, in, 16): column blocks of 16, zero-padded."""
    N, K = w.shape
    nb = -(-N // 16)
    wp = torch.zeros(nb * 16, K, dtype=torch.float32)
    wp[:N] = w
    return wp.view(nb, 16, K).transpose(1, 2).contiguous()


def _best_of(f, reps: int = 5) -> float:
    f()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


# Rows a packed product of fewer rows runs as, per dtype (``pad_rows``); 2 where not decided: one row is
# always run as two (``Linear``'s docstring)
_PAD_ROWS: dict[torch.dtype, int] = {}


def pad_rows(dtype: torch.dtype) -> int:
    """Decide (once per process and dtype; measured once per machine, engine/dtype_probe.packed_rows)
    how many rows a small oneDNN packed product runs as, and return it. On the AVX-512 BF16 EPYC a
    bf16 pass over SmolLM2-135M's weights (streamed from memory) took 14.2 ms at 2 rows and 12.1 at
    4, and a whole 1-row decode step 22.3 -> 19.7 ms (bench/results/2026-11-27-session22): oneDNN
    picks a slower kernel for 1-2 rows there. SPECCHAT_PAD_ROWS=N sets it."""
    n = _PAD_ROWS.get(dtype)
    if n is None:
        env = os.environ.get("SPECCHAT_PAD_ROWS", "").strip()
        if env.isdigit() and int(env) >= 2:
            n = int(env)
        elif packs(dtype):
            from ..dtype_probe import packed_rows

            n = packed_rows(dtype)
        else:
            n = 2
        _PAD_ROWS[dtype] = n
    return n


class Linear:
    """A projection weight as the engine multiplies it: ``x @ W_t`` for a checkpoint weight W
    stored [out, in]. ``shape`` is W_t's, (in, out), as for the plain tensor it replaces.

    On CPU (float32 / bfloat16, oneDNN available) the weight is kept only in oneDNN's pre-packed
    blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's weight freezing
    uses), which skips the per-call reorder of the plain layouts: measured on this 2-core AVX2
    CPU, SmolLM2-135M's projections 1.6-1.9x faster at 1-8 rows in bf16 and the 576 x 49152 head
    1.7x, fp32 4x at 8 rows; a whole bf16 decode step 18.2 -> 14.8 ms. The packed product gives
    the same bits as ``x @ W_t`` for two or more rows and one row's bits do not depend on the
    other rows (asserted in tests/test_models.py), so one row is run as two, as in ``mm``.
    Elsewhere (CUDA, builds without oneDNN, other dtypes) it holds the ``as_t`` tensor.
    """

    __slots__ = ("_blocks", "_dense", "_gemv", "_packed", "_qrec", "_qtype", "dtype", "shape")

    def __init__(self, w: torch.Tensor, dtype: torch.dtype, pack: bool | None = None, native: bool | None = None):
        w = w.detach().to(dtype)
        self.shape = torch.Size((w.shape[1], w.shape[0]))
        self.dtype = dtype
        self._packed = None
        self._dense = None
        self._blocks = None  # linear.c's layout (then the only copy of the weight)
        self._qrec = self._qtype = None  # GGUF-quantised records (engine/models/quant.py), then the only copy
        self._gemv: torch.Tensor | bool | None = None  # fast_rows' single-row operand: None = not measured yet, False = slower
        cpu2d = w.device.type == "cpu" and w.dim() == 2
        if native is None:
            native = cpu2d and dtype == torch.float32 and native_linear()
        if native:
            self._blocks = _blocks16(w)
            return
        if pack is None:
            pack = cpu2d and packs(dtype)
        if pack:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 1)
        else:
            self._dense = _layout_t(w, dtype)

    @classmethod
    def quantized(cls, records: torch.Tensor, qtype: str, K: int, N: int) -> Linear:
        """A weight kept in GGUF blocks (``quant.pack``'s records, Q4_1 or Q8_0): fp32 products
        bit-identical to the dequantised weight's through linear.c (engine/models/quant.py)."""
        self = cls.__new__(cls)
        self.shape = torch.Size((K, N))
        self.dtype = torch.float32
        self._packed = self._dense = self._blocks = None
        self._gemv = None
        self._qrec, self._qtype = records, qtype
        return self

    def native_weight(self) -> tuple[int, int] | None:
        """(pointer, qtype) of the weight as linear.c holds it (qtype 0 = fp32 blocks), or None."""
        if self._qrec is not None:
            from .quant import QTYPES

            return self._qrec.data_ptr(), QTYPES[self._qtype]
        if self._blocks is not None:
            return self._blocks.data_ptr(), 0
        return None

    @classmethod
    def bf16(cls, w: torch.Tensor) -> Linear:
        """An [out, in] weight held as bf16 records (``quant.pack_bf16``) for the CPU bf16 compute
        type: products through engine/native/bf16_rows.c (activations rounded to bf16, fp32 sums,
        a row's bits independent of the others)."""
        from .quant import pack_bf16

        N, K = w.shape
        return cls.quantized(pack_bf16(w), "BF16", K, N)

    def to_bf16(self) -> Linear:
        """This weight as bf16 records (``bf16``); itself where it is already quantised or K is odd."""
        K, N = self.shape
        if self._qrec is not None or K % 2:
            return self
        return Linear.bf16(self.dense().t())

    def to_q8_0(self, act8: bool = False) -> Linear:
        """This fp32 weight quantised to GGUF Q8_0 and held in records (engine/models/quant.py), or
        itself where that does not apply (not linear.c's, already quantised, in % 32 != 0). For
        drafters only: the products change (by Q8_0's rounding of the weights; ``act8``: and of the
        activations, the q8 compute type's records)."""
        K, N = self.shape
        if self._blocks is None or self.dtype != torch.float32 or K % 32:
            return self
        from .quant import pack, quantize_rows

        qt = "Q8_0a8" if act8 else "Q8_0"
        nb = self._blocks.shape[0]  # the blocks' (N, K) rows in one copy (dense() would transpose twice)
        rows = self._blocks.transpose(1, 2).reshape(nb * 16, K)[:N]
        return Linear.quantized(pack(quantize_rows(rows, "Q8_0"), qt, K), qt, K, N)

    @property
    def packed(self) -> bool:
        return self._packed is not None

    def dense(self) -> torch.Tensor:
        """W_t as a plain (in, out) tensor. A packed weight is unpacked exactly (the identity
        through the packed product: every output is one weight times 1 plus zeros)."""
        if self._dense is not None:
            return self._dense
        if self._qrec is not None:
            from .quant import dequantize_rows

            K, N = self.shape
            return dequantize_rows(self._qrec, self._qtype, N, K, torch.arange(N)).t().contiguous()
        if self._blocks is not None:
            nb, K, _ = self._blocks.shape
            return self._blocks.transpose(1, 2).reshape(nb * 16, K)[: self.shape[1]].t().contiguous()
        eye = torch.eye(self.shape[0], dtype=self.dtype)
        return torch.ops.mkldnn._linear_pointwise(eye, self._packed, None, "none", [], "")

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self._gemv is not False and x.dim() == 2 and x.shape[0] == 1 and rows_fast():
            g = self._gemv if self._gemv is not None else self._measure_gemv(x)
            if g is not False:
                return x @ g if bias is None else torch.addmm(bias, x, g)
        return self._exact(x, bias)

    def _measure_gemv(self, x: torch.Tensor) -> torch.Tensor | bool:
        """Once per weight, on the first single-row drafter call: a plain GEMV over an unpacked
        copy against the row-consistent path (a packed weight runs one row as two); the faster is
        kept. Measured, not assumed: on an AVX2 EPYC the fp32 GEMV was 2-3x faster for a drafter's
        projections and its 480 x 11,327 head, and CPUs with AVX-512 may well differ."""
        if x.device.type != "cpu":
            self._gemv = False
            return False
        g = self._dense if self._dense is not None else _layout_t(self.dense().t(), self.dtype)
        if _best_of(lambda: x @ g) < 0.9 * _best_of(lambda: self._exact(x, None)):
            self._gemv = g
        else:
            self._gemv = False
        return self._gemv

    def _exact(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self._blocks is not None or self._qrec is not None:
            return self._native(x.float(), bias)
        rows = x.shape[0] if x.dim() == 2 else 0
        if self._packed is not None:
            pad = _PAD_ROWS.get(self.dtype, 2)
            if 0 < rows < pad:  # a small product padded: its rows' bits do not depend on the others
                x = torch.cat((x, x[:1].expand(pad - rows, -1)))
                return torch.ops.mkldnn._linear_pointwise(x, self._packed, bias, "none", [], "")[:rows]
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, bias, "none", [], "")
        one = rows == 1 and x.dtype == torch.bfloat16
        if one:
            x = x.expand(2, -1)
        if bias is not None:
            y = torch.addmm(bias, x, self._dense) if x.dim() == 2 else x @ self._dense + bias
        else:
            y = x @ self._dense
        return y[:1] if one else y

    def _native(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        from .. import native

        K, N = self.shape
        x2 = x.reshape(-1, K)
        if x2.stride(1) != 1 or x2.stride(0) < K:
            x2 = x2.contiguous()
        y = torch.empty(x2.shape[0], N, dtype=torch.float32)
        if bias is not None:
            bias = bias.float().contiguous()
        b = None if bias is None else bias.data_ptr()
        if self._qrec is not None:
            from .quant import QTYPES

            rc = native.lib().linear_rows_q(x2.data_ptr(), x2.stride(0), x2.shape[0], K, self._qrec.data_ptr(), QTYPES[self._qtype],
                                            N, b, y.data_ptr(), native.threads())
        else:
            rc = native.lib().linear_rows_f32(x2.data_ptr(), x2.stride(0), x2.shape[0], K, self._blocks.data_ptr(), N,
                                              b, y.data_ptr(), native.threads())
        if rc:
            raise MemoryError(f"linear.c failed ({rc}) for {self!r}")
        return y.view(*x.shape[:-1], N)

    def __rmatmul__(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)

    def take_cols(self, cols: torch.Tensor) -> Linear:
        """The same weight restricted to output columns ``cols`` (a drafter's draft vocabulary). A
        weight held in GGUF records stays in records of its type (the columns' weights quantised
        again: exact for Q8_0 whose blocks reach +-127, as GGUF's quantiser makes them); it used to
        come back as fp32 blocks, 3.6x the bytes a draft step streams (the shipped drafter's
        480 x 11,327 head: 21.7 MB a token)."""
        K, N = self.shape
        if self._qrec is not None and self._qtype == "BF16":
            from .quant import dequantize_rows

            return Linear.bf16(dequantize_rows(self._qrec, self._qtype, N, K, cols))  # exact: bf16 values
        if self._qrec is not None and K % 32 == 0:
            from .quant import dequantize_rows, pack, quantize_rows

            w = dequantize_rows(self._qrec, self._qtype, N, K, cols)  # only the kept columns' rows
            base = self._qtype.removesuffix("a8")
            return Linear.quantized(pack(quantize_rows(w, base), self._qtype, K), self._qtype, K, w.shape[0])
        w = self.dense()[:, cols].t()
        return Linear(w, self.dtype, pack=self._packed is not None, native=self._blocks is not None or self._qrec is not None)

    def __repr__(self) -> str:
        kind = (f"native {self._qtype}" if self._qrec is not None else "native" if self._blocks is not None
                else "packed" if self.packed else "dense")
        return f"Linear(in={self.shape[0]}, out={self.shape[1]}, {str(self.dtype).replace('torch.', '')}, {kind})"


def mm(x: torch.Tensor, w: torch.Tensor | Linear) -> torch.Tensor:
    """``x @ w`` whose rows do not depend on how many rows go together. CPU bf16 GEMMs are
    row-independent for 2+ rows, but a single row takes a GEMV path that splits long reductions
    differently (measured: K = 1536, ~7% of rows differ in the last bit), which would make a
    1-token decode step and a k-token verify pass disagree at near-ties. One row is therefore run
    as two: plain decoding and speculative verification then see bit-identical numbers, which is
    what lossless means in bf16 (reference/cpu-performance.md: a 2-row bf16 pass costs ~1 row's).
    ``w`` is a ``Linear`` (which does the same) or an (in, out) tensor."""
    if type(w) is Linear:
        return w(x)
    if x.dtype == torch.bfloat16 and x.dim() == 2 and x.shape[0] == 1:
        return (x.expand(2, -1) @ w)[:1]
    return x @ w


def addmm(b: torch.Tensor, x: torch.Tensor, w: torch.Tensor | Linear) -> torch.Tensor:
    """``b + x @ w`` (torch.addmm) with ``mm``'s guarantee: a single bf16 row runs as two."""
    if type(w) is Linear:
        return w(x, b)
    if x.dtype == torch.bfloat16 and x.dim() == 2 and x.shape[0] == 1:
        return torch.addmm(b, x.expand(2, -1), w)[:1]
    return torch.addmm(b, x, w)


_BF16_RECORDS: contextvars.ContextVar[bool] = contextvars.ContextVar("specchat_bf16_records", default=False)


@contextlib.contextmanager
def building_bf16_records():
    """Inside, ``as_t`` holds fp32 weights (K even) as bf16 records (``Linear.bf16``) at once: a
    model built in fp32 for the CPU bf16 compute type (engine/loading.py, ``Llama.keep_bf16``)
    skips the fp32 layouts it would drop (SmolLM2's load: ~0.9 s of packing and unpacking)."""
    token = _BF16_RECORDS.set(True)
    try:
        yield
    finally:
        _BF16_RECORDS.reset(token)


def as_t(w: torch.Tensor, dtype: torch.dtype) -> Linear:
    """A [out, in] checkpoint weight as the (in, out) operand of ``mm(x, W_t)``: a ``Linear``
    (bf16 records inside ``building_bf16_records``)."""
    if _BF16_RECORDS.get() and dtype == torch.float32 and w.dim() == 2 and w.shape[1] % 2 == 0 and w.device.type == "cpu" and not w.is_meta:
        return Linear.bf16(w)
    return Linear(w, dtype)


def _layout_t(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An unpacked [out, in] weight as an [in, out] operand for ``x @ W_t``, in the layout that is
    faster for the dtype on CPU: fp32 stores it transposed and contiguous (reference/cpu-performance.md:
    ~1.4x for a GEMV); bf16/fp16 keep the [out, in] storage and return its transposed view, which
    is what torch's linear uses (measured on this CPU, 1 thread: SmolLM2's 576 x 49152 head,
    2 rows, 3.3 ms through the view vs 7.9 ms contiguous [in, out]; equal for the small
    projections)."""
    if dtype in (torch.bfloat16, torch.float16):
        return w.contiguous().t()
    return w.t().contiguous()


def take_cols(w_t: torch.Tensor | Linear, cols: torch.Tensor) -> torch.Tensor | Linear:
    """``w_t[:, cols]`` in ``w_t``'s layout (a Linear stays one, a transposed view stays one)."""
    if type(w_t) is Linear:
        return w_t.take_cols(cols)
    if w_t.dim() == 2 and w_t.stride(0) == 1 and w_t.stride(1) != 1:
        return w_t.t()[cols].t()
    return w_t[:, cols].contiguous()
