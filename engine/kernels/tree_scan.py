"""Tree scan of a Mamba-2 (SSD) layer over a packed draft tree from an initial state (STree §3
"tree decoding with SSMs": every node continues its parent's state, so siblings share the prefix
computed once).

Shapes (T nodes in topological order, H heads of P channels, G groups, N state size):

    state   (H, P, N) fp32     the committed state (the root's)
    x       (T, H, P); B, C (T, G, N); dt (T, H) fp32; A (H,) fp32
    parents (T,) int64         parent node of each node, -1 = the root; parents precede children

    S_i = exp(dt_i·A)·S_parent(i) + dt_i·x_i ⊗ B_i,   y_i = S_i·C_i

Returns y (T, H, P) fp32 (no D skip: engine.models.mamba2.tree_scan's contract) and, when
``keep_states``, every node's state (T, H, P, N) fp32 (what replay would otherwise recompute).
The kernel walks the nodes in order (a runtime loop: one compiled kernel for every tree size);
each node's state goes to a scratch buffer its children read (on a GPU the few-dozen-node trees
of verification stay in L2). Parent values are checked only when ``parents`` is on the CPU: on a
GPU the check would cost a host sync per launch (the engine checks its trees on the host).
"""

from __future__ import annotations

import torch

from . import HAS_TRITON
from .ssd_update import state_block_p

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _tree_scan_kernel(state_ptr, x_ptr, B_ptr, C_ptr, dt_ptr, A_ptr, par_ptr, y_ptr, states_ptr,
                          H, P, G, N, T, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
        h = tl.program_id(0)
        pb = tl.program_id(1)
        g = h // (H // G)
        p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
        n = tl.arange(0, BLOCK_N)
        mp, mn = p < P, n < N
        m2 = mp[:, None] & mn[None, :]
        hp = (h * P + p[:, None]) * N + n[None, :]  # offset of (h, p, n) within one (H, P, N) state
        S0 = tl.load(state_ptr + hp, mask=m2, other=0.0)
        a = tl.load(A_ptr + h)
        for i in range(T):
            par = tl.load(par_ptr + i)
            # read a real node's slot even for the root (clamped index), then choose: a scalar
            # condition inside a block mask is not portable across Triton versions
            Sp = tl.load(states_ptr + tl.maximum(par, 0).to(tl.int64) * H * P * N + hp, mask=m2, other=0.0)
            Sp = tl.where(par >= 0, Sp, S0)
            x = tl.load(x_ptr + (i * H + h) * P + p, mask=mp, other=0.0).to(tl.float32)
            b = tl.load(B_ptr + (i * G + g) * N + n, mask=mn, other=0.0).to(tl.float32)
            c = tl.load(C_ptr + (i * G + g) * N + n, mask=mn, other=0.0).to(tl.float32)
            dt = tl.load(dt_ptr + i * H + h)
            S = Sp * tl.exp(dt * a) + (dt * x)[:, None] * b[None, :]
            tl.store(states_ptr + i * H * P * N + hp, S, mask=m2)
            tl.store(y_ptr + (i * H + h) * P + p, tl.sum(S * c[None, :], axis=1), mask=mp)
            tl.debug_barrier()  # this node's state is visible to its children's loads


def tree_scan_ref(state, x, B, C, dt, A, parents, keep_states: bool = False):
    """Node by node in fp32 (same signature and results as ``tree_scan``)."""
    T, H, P = x.shape
    R = H // B.shape[1]
    states = []
    ys = []
    for i in range(T):
        Sp = state.float() if parents[i] < 0 else states[int(parents[i])]
        Bh, Ch = B[i].float().repeat_interleave(R, 0), C[i].float().repeat_interleave(R, 0)  # (H, N)
        S = Sp * torch.exp(dt[i].float() * A)[:, None, None] + (dt[i].float()[:, None] * x[i].float())[..., None] * Bh[:, None, :]
        states.append(S)
        ys.append((S @ Ch[..., None])[..., 0])
    y = torch.stack(ys) if ys else x.new_zeros((0, H, P), dtype=torch.float32)
    return (y, torch.stack(states)) if keep_states else y


def tree_scan(state, x, B, C, dt, A, parents, keep_states: bool = False, block_p: int | None = None):
    """Triton launcher: one program per (head, block of P channels), nodes in packed order."""
    assert HAS_TRITON, "tree_scan needs triton; use tree_scan_ref"
    T, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    assert state.shape == (H, P, N), f"state {tuple(state.shape)} != (H, P, N) = {(H, P, N)}"
    assert B.shape == C.shape == (T, G, N) and dt.shape == (T, H) and A.shape == (H,), "bad B/C/dt/A shapes"
    assert parents.shape == (T,), f"parents {tuple(parents.shape)} != ({T},)"
    assert parents.is_cuda or all(-1 <= int(q) < i for i, q in enumerate(parents.tolist())), \
        "parents must be (T,) with each parent an earlier node or -1"
    state, x, B, C = (t.contiguous() for t in (state.float(), x, B, C))
    y = torch.empty((T, H, P), dtype=torch.float32, device=x.device)
    states = torch.empty((T, H, P, N), dtype=torch.float32, device=x.device)
    if T:
        BLOCK_P = block_p or state_block_p(P, triton.next_power_of_2(N))
        grid = (H, triton.cdiv(P, BLOCK_P))
        _tree_scan_kernel[grid](state, x, B, C, dt.float().contiguous(), A.float().contiguous(),
                                parents.to(torch.int64).contiguous(), y, states, H, P, G, N, T,
                                BLOCK_P=BLOCK_P, BLOCK_N=triton.next_power_of_2(N))
    return (y, states) if keep_states else y
