"""Recurrent-state rows gathered by index, on device (Snakes and Ladders App. B "JIT state copy";
mamba-drafters §4.1: a drafter forks its parent's state into one row per child).

    out[l, j] = state[l, idx[j]]        state (L, B, F...) -> out (L, len(idx), F...)

Forks and commits of draft rows use it without a host round trip: ``idx`` stays a device tensor.
"""

from __future__ import annotations

import math

import torch

from . import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _state_gather_kernel(src_ptr, idx_ptr, dst_ptr, B_src, B_dst, F, BLOCK: tl.constexpr):
        layer = tl.program_id(0)
        j = tl.program_id(1)
        chunk = tl.program_id(2)
        row = tl.load(idx_ptr + j).to(tl.int64)
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        m = offs < F
        src = src_ptr + (layer.to(tl.int64) * B_src + row) * F
        dst = dst_ptr + (layer.to(tl.int64) * B_dst + j) * F
        tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


def state_gather_ref(state: torch.Tensor, idx: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """state (L, B, ...) , idx (J,) int64 -> (L, J, ...), into ``out`` when given (a pool buffer)."""
    if out is None:
        return torch.index_select(state, 1, idx)
    return torch.index_select(state, 1, idx, out=out)


def state_gather(state: torch.Tensor, idx: torch.Tensor, out: torch.Tensor | None = None, block: int = 1024) -> torch.Tensor:
    """Triton launcher of ``state_gather_ref`` (same signature and result). ``out`` must not
    overlap ``state``; index values are not checked (that would cost a host sync)."""
    assert HAS_TRITON, "state_gather needs triton; use state_gather_ref"
    assert state.dim() >= 2, f"state must be (L, B, ...), got shape {tuple(state.shape)}"
    assert idx.dim() == 1 and idx.dtype in (torch.int32, torch.int64), "idx must be a 1-d integer tensor"
    src = state.contiguous()
    L, B = src.shape[:2]
    F = math.prod(src.shape[2:])
    shape = (L, idx.numel(), *src.shape[2:])
    if out is None:
        out = torch.empty(shape, dtype=src.dtype, device=src.device)
    assert out.shape == shape and out.dtype == src.dtype and out.is_contiguous(), \
        f"out must be a contiguous {src.dtype} tensor of shape {shape}"
    if out.numel() == 0:
        return out
    grid = (L, idx.numel(), triton.cdiv(F, block))
    _state_gather_kernel[grid](src, idx.to(src.device), out, B, idx.numel(), F, BLOCK=block)
    return out
