"""Fused multi-step state update of a Mamba-2 (SSD) layer from an initial state (Snakes and
Ladders §3.2 and App. A: several tokens per launch with the state kept in fast memory; used to
verify a short chain and, given node indices, to replay an accepted path, §3.3).

Shapes (R sequences, T steps, H heads of P channels, G groups, N state size):

    state (R, H, P, N) fp32      initial states; not modified
    x     (R, T, H, P)           conv + SiLU output
    B, C  (R, T, G, N)           head h reads group h // (H / G)
    dt    (R, T, H) fp32         after softplus, bias and clamp
    A     (H,) fp32              negative decay rates; D (H,) or None: the skip
    path  (R, M) int64 or None   read rows path[r, :] of x/B/C/dt instead of 0..T-1 (replay)

    S_t = exp(dt_t·A)·S_{t-1} + dt_t·x_t ⊗ B_t,   y_t = S_t·C_t + D·x_t

Returns y (R, M, H, P) fp32 (M = T without ``path``; None when C is None: a replay wants only the
state) and the final state (R, H, P, N) fp32, written to ``out`` when given — which may be
``state`` itself (each program reads its block of the state before it writes it back): the
drafter's one-token step updates its rows in place.

The steps are a runtime loop, not unrolled: one compiled kernel serves every chain length (a
verify of 7 nodes, a replay of 3, a prefill chunk of 256) and a launch needs no host sync, so a
CUDA graph can hold it.
"""

from __future__ import annotations

import torch

from . import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _ssd_update_kernel(state_ptr, x_ptr, B_ptr, C_ptr, dt_ptr, A_ptr, D_ptr, path_ptr, y_ptr, out_ptr,
                           T, H, P, G, N, M, HAS_C: tl.constexpr,
                           HAS_D: tl.constexpr, HAS_PATH: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        pb = tl.program_id(2)
        g = h // (H // G)
        p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
        n = tl.arange(0, BLOCK_N)
        mp, mn = p < P, n < N
        m2 = mp[:, None] & mn[None, :]
        s_off = ((r * H + h) * P + p[:, None]) * N + n[None, :]
        S = tl.load(state_ptr + s_off, mask=m2, other=0.0)  # (BLOCK_P, BLOCK_N), kept on chip across steps
        a = tl.load(A_ptr + h)
        d = tl.load(D_ptr + h) if HAS_D else 0.0
        for i in range(M):
            if HAS_PATH:
                t = tl.load(path_ptr + r * M + i)
            else:
                t = i
            rt = r * T + t
            x = tl.load(x_ptr + (rt * H + h) * P + p, mask=mp, other=0.0).to(tl.float32)
            b = tl.load(B_ptr + (rt * G + g) * N + n, mask=mn, other=0.0).to(tl.float32)
            dt = tl.load(dt_ptr + rt * H + h)
            S = S * tl.exp(dt * a) + (dt * x)[:, None] * b[None, :]
            if HAS_C:
                c = tl.load(C_ptr + (rt * G + g) * N + n, mask=mn, other=0.0).to(tl.float32)
                y = tl.sum(S * c[None, :], axis=1) + d * x
                tl.store(y_ptr + ((r * M + i) * H + h) * P + p, y, mask=mp)
        tl.store(out_ptr + s_off, S, mask=m2)


def state_block_p(P: int, block_n: int) -> int:
    """Channels per program for a (BLOCK_P, BLOCK_N) fp32 state block held in registers across
    the steps: at most 2048 elements. ptxas for sm_90 (4 warps, N = 128): 16 channels take 125
    registers and spill nothing, 32 take 220, 64 spill (255 registers + 120-384 bytes of stack);
    smaller blocks also give a sequential scan more programs to hide its latency with."""
    return max(1, min(64, triton.next_power_of_2(P), 2048 // block_n))


def _groups(t: torch.Tensor, H: int) -> torch.Tensor:
    """(..., G, N) -> (..., H, N): head h reads group h // (H / G)."""
    return t.repeat_interleave(H // t.shape[-2], dim=-2)


def ssd_update_ref(state, x, B, C, dt, A, D=None, path=None, out=None):
    """The recurrence, one step at a time, in fp32 (same signature and results as ``ssd_update``)."""
    if path is not None:
        take = lambda t: None if t is None else torch.stack([t[r, path[r]] for r in range(t.shape[0])])  # noqa: E731
        x, B, C, dt = take(x), take(B), take(C), take(dt)
    R, M, H, P = x.shape
    S = state.float().clone()
    ys = []
    for t in range(M):
        xt, Bt = x[:, t].float(), _groups(B[:, t].float(), H)  # (R, H, P), (R, H, N)
        dtt = dt[:, t].float()  # (R, H)
        S = S * torch.exp(dtt * A)[:, :, None, None] + (dtt[:, :, None] * xt)[..., None] * Bt[:, :, None, :]
        if C is not None:
            y = (S @ _groups(C[:, t].float(), H)[..., None])[..., 0]
            ys.append(y if D is None else y + D[:, None] * xt)
    if out is not None:
        out.copy_(S)
        S = out
    if C is None:
        return None, S
    return (torch.stack(ys, dim=1) if ys else x.new_zeros((R, 0, H, P), dtype=torch.float32)), S


def ssd_update(state, x, B, C, dt, A, D=None, path=None, out=None, block_p: int | None = None):
    """Triton launcher: one program per (sequence, head, block of P channels); the state block
    stays in registers for all steps. Index values are checked only when ``path`` is on the CPU:
    on a GPU the check would cost a host sync per launch (the engine's indices are checked where
    they are made, on the host)."""
    assert HAS_TRITON, "ssd_update needs triton; use ssd_update_ref"
    R, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    assert state.shape == (R, H, P, N), f"state {tuple(state.shape)} != (R, H, P, N) = {(R, H, P, N)}"
    assert B.shape == (R, T, G, N) and (C is None or C.shape == B.shape), \
        f"B {tuple(B.shape)} / C {None if C is None else tuple(C.shape)} != {(R, T, G, N)}"
    assert dt.shape == (R, T, H) and A.shape == (H,), "dt must be (R, T, H) and A (H,)"
    assert H % G == 0, f"{H} heads do not split into {G} groups"
    M = T if path is None else path.shape[1]
    if path is not None:
        assert path.shape[0] == R and path.dtype == torch.int64, "path must be (R, M) int64"
        assert path.is_cuda or M == 0 or (int(path.min()) >= 0 and int(path.max()) < T), "path indices out of range"
    state, x, B = state.float().contiguous(), x.contiguous(), B.contiguous()
    C = C.contiguous() if C is not None else None
    dt, A = dt.float().contiguous(), A.float().contiguous()
    y = torch.empty((R, M, H, P), dtype=torch.float32, device=x.device) if C is not None else None
    if out is None:
        out = torch.empty_like(state)
    assert out.shape == state.shape and out.dtype == torch.float32 and out.is_contiguous(), "out must be a contiguous fp32 (R, H, P, N)"
    BLOCK_N = triton.next_power_of_2(N)
    BLOCK_P = block_p or state_block_p(P, BLOCK_N)
    grid = (R, H, triton.cdiv(P, BLOCK_P))
    if R and M:
        _ssd_update_kernel[grid](state, x, B, C if C is not None else B, dt, A, D.float().contiguous() if D is not None else A,
                                 path.contiguous() if path is not None else dt, y if y is not None else out, out,
                                 T, H, P, G, N, M, HAS_C=C is not None, HAS_D=D is not None, HAS_PATH=path is not None,
                                 BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N)
    elif out is not state:
        out.copy_(state)
    return y, out
