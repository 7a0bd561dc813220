"""Mamba-2's SSD scan over a chain from an initial state, returning the final state: the
long-prefill scan (Mamba-2 §6's chunked algorithm in mamba_ssm's ``mamba_chunk_scan_combined``;
the engine's own ops target trees of tens of nodes: STree §3, Snakes and Ladders §3.2).

    S_t = exp(dt_t * A) * S_{t-1} + dt_t * x_t (x) B_t,     y_t = S_t . C_t      (per head; D not included)

state (H, P, N) fp32; x (T, H, P); B, C (T, G, N); dt (T, H) after softplus and limits; A (H,)
-> y (T, H, P) fp32, final state (H, P, N) fp32. ``backend="mamba_ssm"`` calls
mamba_chunk_scan_combined (dt as given: no bias, no softplus); ``"ref"`` is the recurrence in
plain PyTorch, one token at a time.
"""

from __future__ import annotations

import torch

CHUNK = 256  # mamba_ssm's chunk length (Mamba-2 checkpoints' own chunk_size)


def chunk_scan_ref(state: torch.Tensor, x: torch.Tensor, B: torch.Tensor, C: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                   backend: str = "ref") -> tuple[torch.Tensor, torch.Tensor]:
    H = x.shape[1]
    R = H // B.shape[1]
    S = state.float().clone()
    ys = []
    for t in range(x.shape[0]):
        Bh, Ch = B[t].float().repeat_interleave(R, 0), C[t].float().repeat_interleave(R, 0)  # (H, N)
        S = torch.exp(dt[t].float() * A.float())[:, None, None] * S + (dt[t].float()[:, None] * x[t].float())[..., None] * Bh[:, None, :]
        ys.append((S @ Ch[..., None])[..., 0])
    return torch.stack(ys), S


def chunk_scan(state: torch.Tensor, x: torch.Tensor, B: torch.Tensor, C: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
               backend: str = "mamba_ssm") -> tuple[torch.Tensor, torch.Tensor]:
    """As chunk_scan_ref; ``backend`` "mamba_ssm" or "ref"."""
    if backend == "ref":
        return chunk_scan_ref(state, x, B, C, dt, A)
    if backend != "mamba_ssm":
        raise ValueError(f"chunk_scan backend must be 'mamba_ssm' or 'ref', not {backend!r}")
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    # x (batch, seqlen, nheads, headdim), dt (batch, seqlen, nheads), A (nheads,), B/C (batch,
    # seqlen, ngroups, dstate), initial_states (batch, nheads, headdim, dstate): its documented layout
    y, final = mamba_chunk_scan_combined(x[None].contiguous(), dt[None].float().contiguous(), A.float(), B[None].contiguous(),
                                         C[None].contiguous(), CHUNK, initial_states=state[None].float().contiguous(),
                                         dt_softplus=False, return_final_states=True)
    return y[0].float(), final[0].float()
