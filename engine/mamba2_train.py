"""A leaner chunked SSD scan for training Mamba-2 drafters through transformers without mamba_ssm.

`distill train` runs transformers' ``Mamba2ForCausalLM``, whose PyTorch fallback for the chunked
scan (``mamba2_chunk_scan``, the SSD "minimal" form: mamba-drafters §3 trains such drafters; the
algorithm is Mamba-2's state space duality) first repeats B and C across every head of their
group (``repeat_interleave``), so the (positions x positions) score matrix C·Bᵀ of each chunk is
computed and stored once per head: 15 times for the shipped drafter's one group of 15 heads. This
version keeps the group axis, computes C·Bᵀ once per group and broadcasts it over the group's
heads, and folds the decay into the operands of the state sums; the result is the same function
(fp32 rounding aside; the tests compare values and gradients with transformers' own path).

Measured on the 2-core Zen 4 EPYC (bf16 autocast, d480 x 3, 8 x 512 tokens, forward + backward,
interleaved in one process): 3.2-3.6 s -> 2.5-2.7 s; a whole `distill train` step, optimiser and output
layer included, ~10-15% less (bench/results/2026-11-27-session27/).

Only for training: the engine's own Mamba-2 (engine/models/mamba2.py) never calls transformers.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from typing import Iterator

import torch
import torch.nn.functional as F


def _segment_sum(x: torch.Tensor) -> torch.Tensor:
    """(..., T) -> (..., T, T): out[..., i, j] = sum(x[..., j+1 : i+1]) for j <= i, -inf above the
    diagonal (exp of it is the causal decay matrix); cumulative sums of masked copies, as the
    reference does, for stability."""
    T = x.size(-1)
    x = x[..., None].expand(*x.size(), T)
    x = x.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=-1), 0)
    s = torch.cumsum(x, dim=-2)
    return s.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=0), -torch.inf)


def chunk_scan(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               chunk_size: int, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
               initial_states: torch.Tensor | None = None, dt_softplus: bool = False,
               dt_limit: tuple[float, float] = (0.0, float("inf")), return_final_states: bool = False, **_):
    """transformers' ``mamba2_chunk_scan`` (same arguments, same results): x (b, L, h, p), dt
    (b, L, h), A (h,), B and C (b, L, g, n); returns y (b, L, h, p) [and the final state
    (b, h, p, n)]."""
    b, L, h, p = hidden_states.shape
    g, n = B.shape[2], B.shape[3]
    r = h // g  # heads per group
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]).float()
    x = hidden_states.float()
    pad = (-L) % chunk_size
    if pad:  # zero rows: dt = 0 there, so they neither decay nor feed the state
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
    c, l = (L + pad) // chunk_size, chunk_size
    xd = (x * dt[..., None]).view(b, c, l, g, r, p)
    a = (A.float() * dt).view(b, c, l, g, r).permute(0, 3, 4, 1, 2)  # (b, g, r, c, l)
    a_cum = a.cumsum(-1)
    Bc, Cc = B.float().view(b, c, l, g, n), C.float().view(b, c, l, g, n)
    # 1. within a chunk: scores C·Bᵀ once per group, the decay per head
    scores = torch.einsum("bclgn,bcsgn->bgcls", Cc, Bc)
    y = torch.einsum("bgrcls,bcsgrp->bclgrp", scores[:, :, None] * torch.exp(_segment_sum(a)), xd)
    # 2. each chunk's state from its own positions
    decay = torch.exp(a_cum[..., -1:] - a_cum).permute(0, 3, 4, 1, 2)[..., None]  # (b, c, l, g, r, 1)
    states = torch.einsum("bclgn,bclgrp->bcgrpn", Bc, xd * decay)
    # 3. the states at chunk boundaries (the recurrence across chunks)
    init = (initial_states.to(states.dtype).view(b, 1, g, r, p, n) if initial_states is not None
            else torch.zeros_like(states[:, :1]))
    states = torch.cat([init, states], 1)
    states = torch.einsum("bgrzc,bcgrpn->bzgrpn", torch.exp(_segment_sum(F.pad(a_cum[..., -1], (1, 0)))), states)
    states, final = states[:, :-1], states[:, -1]
    # 4. each position's read of its chunk's starting state
    y = y + torch.einsum("bclgn,bcgrpn->bclgrp", Cc, states) * torch.exp(a_cum).permute(0, 3, 4, 1, 2)[..., None]
    y = y.reshape(b, c * l, h, p)
    if D is not None:
        y = y + D[:, None] * x
    y = y[:, :L]
    return (y, final.reshape(b, h, p, n)) if return_final_states else y


@contextlib.contextmanager
def lean_scan() -> Iterator[bool]:
    """Within the block, transformers' Mamba-2 models run ``chunk_scan`` instead of their PyTorch
    fallback, unless mamba_ssm (whose fused kernels transformers prefers) is installed or
    SPECCHAT_LEAN_SCAN=0 (A/B runs). Yields whether it swapped; the original is back on exit."""
    try:
        import transformers.models.mamba2.modeling_mamba2 as mm
    except ImportError:
        yield False
        return
    if (os.environ.get("SPECCHAT_LEAN_SCAN") == "0" or importlib.util.find_spec("mamba_ssm") is not None
            or not hasattr(mm, "mamba2_chunk_scan")):
        yield False
        return
    original = mm.mamba2_chunk_scan
    mm.mamba2_chunk_scan = chunk_scan
    try:
        yield True
    finally:
        mm.mamba2_chunk_scan = original


class _ChunkedCE(torch.autograd.Function):
    """Cross-entropy of ``h @ W.T`` against ``y`` (mean over y >= 0), a chunk of rows at a time,
    the gradients made in the forward pass: each chunk's logits become their own gradient in place
    (softmax minus the one-hot, over the count), which multiplies W and the chunk's h right away.
    So the (rows x vocabulary) logits never exist whole (8 x 512 tokens x 23.6k draft tokens: 0.39
    GB in fp32, read and written ~8 times a step by log-softmax, the loss and their backward); the
    backward only scales the two gradients. The products run in ``mm_dtype`` (bf16 under `distill
    train --amp bf16`, as autocast ran them), the softmax in fp32."""

    @staticmethod
    def forward(ctx, h, W, y, chunk: int, mm_dtype):
        with torch.autocast(h.device.type, enabled=False):
            ok_all = y >= 0
            n = int(ok_all.sum())
            acc = torch.promote_types(mm_dtype, torch.float32)  # the softmax's and the sums' type
            Wm = W.detach().to(mm_dtype)
            gh = torch.empty(h.shape, dtype=h.dtype, device=h.device)
            gW = torch.zeros(W.shape, dtype=acc, device=W.device)
            total = torch.zeros((), dtype=acc, device=h.device)
            for i in range(0, h.shape[0], chunk):
                hc = h[i:i + chunk].detach().to(mm_dtype)
                ok = ok_all[i:i + chunk]
                yc = y[i:i + chunk].clamp(min=0)[:, None]
                z = (hc @ Wm.T).to(acc)
                lse = torch.logsumexp(z, 1, keepdim=True)
                total += ((lse.squeeze(1) - z.gather(1, yc).squeeze(1)) * ok).sum()
                z.sub_(lse).exp_()  # softmax, in place
                z.scatter_add_(1, yc, -ok.to(z.dtype)[:, None])  # minus the one-hot where the row counts
                z.mul_((ok.to(z.dtype) / max(n, 1))[:, None])
                g = z.to(mm_dtype)
                gh[i:i + chunk] = (g @ Wm).to(h.dtype)
                gW += (g.T @ hc).to(acc)
        ctx.save_for_backward(gh, gW)
        ctx.w_dtype = W.dtype
        return total / n if n else torch.full((), float("nan"), dtype=acc, device=h.device)

    @staticmethod
    def backward(ctx, go):
        gh, gW = ctx.saved_tensors
        return gh * go.to(gh.dtype), (gW * go).to(ctx.w_dtype), None, None, None


def chunked_cross_entropy(h: torch.Tensor, W: torch.Tensor, y: torch.Tensor, chunk: int = 256,
                          mm_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``F.cross_entropy(h @ W.T, y, ignore_index=-1)`` (NaN where no y >= 0, as it) without
    holding the whole logits: ``_ChunkedCE``."""
    return _ChunkedCE.apply(h, W, y, chunk, mm_dtype)
