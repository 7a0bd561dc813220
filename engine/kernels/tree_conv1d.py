"""Depthwise causal conv1d over a packed draft tree (STree §3; Mamba's short conv before the SSM):
each node's window is its last K inputs along its root path — ancestors, then the committed conv
state once the path runs out.

Shapes (T nodes in topological order, C channels, K taps):

    conv_state (C, K-1)        the last K-1 committed inputs, oldest first
    x          (T, C)          the nodes' conv inputs (xBC before the conv)
    w          (K, C)          taps, oldest first; bias (C,) or None
    parents    (T,) int64      parent of each node, -1 = the root

    out_i = bias + Σ_k w[k] · window_i[k],  window_i = (..., x_grandparent, x_parent, x_i)

Returns out (T, C) fp32 (no activation).
"""

from __future__ import annotations

import torch

from . import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _tree_conv1d_kernel(state_ptr, x_ptr, w_ptr, b_ptr, par_ptr, out_ptr, C,
                            K: tl.constexpr, HAS_B: tl.constexpr, BLOCK_C: tl.constexpr):
        i = tl.program_id(0)
        cb = tl.program_id(1)
        c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        mc = c < C
        acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
        if HAS_B:
            acc += tl.load(b_ptr + c, mask=mc, other=0.0).to(tl.float32)
        j = i.to(tl.int64)  # the node whose input feeds the current tap (-e: e steps above the root)
        for s in tl.static_range(K):  # s = 0: the newest tap (node i itself)
            k = K - 1 - s
            wk = tl.load(w_ptr + k * C + c, mask=mc, other=0.0).to(tl.float32)
            from_tree = j >= 0
            # both candidates are read at clamped (valid) addresses and chosen with where: a scalar
            # condition inside a block mask is not portable across Triton versions
            v_tree = tl.load(x_ptr + tl.maximum(j, 0) * C + c, mask=mc, other=0.0).to(tl.float32)
            col = K - 1 + tl.minimum(j, 0)  # j = -e -> conv_state column K-1-e
            v_state = tl.load(state_ptr + c * (K - 1) + tl.maximum(col, 0), mask=mc & (K > 1), other=0.0).to(tl.float32)
            acc += wk * tl.where(from_tree, v_tree, v_state)
            up = tl.load(par_ptr + tl.maximum(j, 0)).to(tl.int64)
            j = tl.where(from_tree, tl.where(up >= 0, up, -1), j - 1)
        tl.store(out_ptr + i * C + c, acc, mask=mc)


def tree_conv1d_ref(conv_state, x, w, bias, parents):
    """Ancestor-gathered windows, as engine.models.mamba2's layer builds them (same signature
    and result as ``tree_conv1d``)."""
    T, C = x.shape
    K = w.shape[0]
    bank = torch.cat([conv_state.t().float(), x.float()])  # (K-1+T, C): committed inputs, then the nodes
    idx = torch.empty(T, K, dtype=torch.long)
    for i in range(T):
        window, j, e = [], i, 0
        for _ in range(K):
            if j >= 0:
                window.append(K - 1 + j)
                j = int(parents[j])
            else:
                e += 1
                window.append(K - 1 - e)
        idx[i] = torch.tensor(window[::-1])
    out = (bank[idx] * w.float()).sum(1)  # (T, K, C) -> (T, C)
    return out + bias.float() if bias is not None else out


def tree_conv1d(conv_state, x, w, bias, parents, block_c: int = 256):
    """Triton launcher: one program per (node, block of channels)."""
    assert HAS_TRITON, "tree_conv1d needs triton; use tree_conv1d_ref"
    T, C = x.shape
    K = w.shape[0]
    assert conv_state.shape == (C, K - 1) and w.shape == (K, C), f"conv_state {tuple(conv_state.shape)}, w {tuple(w.shape)} for C={C}"
    assert parents.shape == (T,), f"parents {tuple(parents.shape)} != ({T},)"
    # values checked on the CPU only: on a GPU it would cost a host sync per launch
    assert parents.is_cuda or all(-1 <= int(q) < i for i, q in enumerate(parents.tolist())), \
        "parents must be (T,) with each parent an earlier node or -1"
    out = torch.empty((T, C), dtype=torch.float32, device=x.device)
    if T:
        grid = (T, triton.cdiv(C, block_c))
        _tree_conv1d_kernel[grid](conv_state.contiguous(), x.contiguous(), w.contiguous(),
                                  bias.contiguous() if bias is not None else w, parents.to(torch.int64).contiguous(), out, C,
                                  K=K, HAS_B=bias is not None, BLOCK_C=block_c)
    return out
