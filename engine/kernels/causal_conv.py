"""Depthwise causal conv1d over a chain continuing a committed conv state: the long-prefill
conv of a Mamba-2 mixer (Snakes and Ladders App. A: prefill runs the model's own dense kernels;
the tree ops serve verification).

    bank = [conv_state | xbc^T]                     (C, K-1+T): the K-1 committed inputs, then the chain
    out[t, c] = bias[c] + sum_k w[k, c] * bank[c, t + k]        (T, C), no activation
    new_state = bank[:, T:]                          (C, K-1): the chain's last K-1 inputs

``backend="mamba_ssm"`` runs causal_conv1d's CUDA kernel (the ``cuda`` extra) over the bank, so
the committed columns need no ``initial_states`` layout; ``"ref"`` is plain PyTorch. Same
signature, same results up to summation order.
"""

from __future__ import annotations

import torch


def _bank(conv_state: torch.Tensor, xbc: torch.Tensor) -> torch.Tensor:
    return torch.cat([conv_state, xbc.t().to(conv_state.dtype)], dim=1)  # (C, K-1+T)


def causal_conv_ref(conv_state: torch.Tensor, xbc: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                    backend: str = "ref") -> tuple[torch.Tensor, torch.Tensor]:
    """conv_state (C, K-1) raw inputs, newest last; xbc (T, C) the chain's raw inputs; w (K, C)
    oldest tap first; b (C,) or None -> (out (T, C) in xbc's dtype, new_state (C, K-1))."""
    K, T = w.shape[0], xbc.shape[0]
    bank = _bank(conv_state, xbc)
    win = bank.unfold(1, K, 1)  # (C, T, K): the window ending at each chain position
    out = (win.float() * w.t().float()[:, None, :]).sum(-1).t()  # (T, C)
    if b is not None:
        out = out + b.float()
    return out.to(xbc.dtype), bank[:, T:].clone()


def causal_conv(conv_state: torch.Tensor, xbc: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                backend: str = "mamba_ssm") -> tuple[torch.Tensor, torch.Tensor]:
    """As causal_conv_ref; ``backend`` "mamba_ssm" (causal_conv1d_fn) or "ref"."""
    if backend == "ref":
        return causal_conv_ref(conv_state, xbc, w, b)
    if backend != "mamba_ssm":
        raise ValueError(f"causal_conv backend must be 'mamba_ssm' or 'ref', not {backend!r}")
    from causal_conv1d import causal_conv1d_fn

    T = xbc.shape[0]
    bank = _bank(conv_state, xbc)
    # x (batch, dim, seqlen), weight (dim, width): causal_conv1d's documented layout
    out = causal_conv1d_fn(bank[None].to(xbc.dtype).contiguous(), w.t().to(xbc.dtype).contiguous(),
                           None if b is None else b.to(xbc.dtype), activation=None)
    return out[0, :, -T:].t(), bank[:, T:].clone()
