"""Triton kernels, one op per file (STYLE.md item 4): ``_op_kernel``, the launcher ``op`` and
``op_ref`` in plain PyTorch with the same signature.

Flags, resolved once here (STYLE.md item 9: never a ``None`` left by a failed import):

    HAS_TRITON   triton is installed
    USE_TRITON   the engine runs the kernels on CUDA tensors: HAS_TRITON, unless the environment
                 says SPECCHAT_TRITON=0 (then the PyTorch path runs on CUDA too, for comparison)
    ON_CPU       tests only: run the kernels on CPU tensors as well, under Triton's interpreter
                 (TRITON_INTERPRET=1 must be set before triton is imported; tests/kernels does)
    HAS_MAMBA_SSM  mamba_ssm and causal_conv1d are installed (the ``cuda`` extra)
    USE_MAMBA_SSM  a long prefill of a Mamba-2 model on CUDA runs their chunked-scan and causal
                 conv kernels (engine/kernels/chunk_scan.py, engine/kernels/causal_conv.py): HAS_MAMBA_SSM and
                 the environment says SPECCHAT_MAMBA_SSM=1 (off unless asked for)
    LONG_PREFILL   the fewest prompt tokens that take that path (SPECCHAT_LONG_PREFILL, default 128)

On a CPU the engine runs the PyTorch path, bit for bit what it ran before the kernels existed; CI
checks the kernels against their references under the interpreter. The kernel modules import
triton themselves, on first use: a CPU-only run never pays for importing it.
"""

from __future__ import annotations

import importlib.util
import os

import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
USE_TRITON = HAS_TRITON and os.environ.get("SPECCHAT_TRITON", "1").strip().lower() not in ("0", "off", "false", "no")
ON_CPU = False
_ON = ("1", "on", "true", "yes")
HAS_MAMBA_SSM = importlib.util.find_spec("mamba_ssm") is not None and importlib.util.find_spec("causal_conv1d") is not None
USE_MAMBA_SSM = HAS_MAMBA_SSM and os.environ.get("SPECCHAT_MAMBA_SSM", "0").strip().lower() in _ON
try:
    LONG_PREFILL = max(1, int(os.environ.get("SPECCHAT_LONG_PREFILL", "128")))
except ValueError:  # a typo in the variable keeps the default rather than stopping the engine
    LONG_PREFILL = 128


def use_triton(t: torch.Tensor) -> bool:
    """Whether the engine runs the Triton op for tensor ``t`` (a CUDA tensor, or any under ON_CPU)."""
    return USE_TRITON and (t.is_cuda or ON_CPU)


def backend(device) -> str:
    """"triton" where ``use_triton`` holds for a tensor on ``device``, else "ref"."""
    return "triton" if USE_TRITON and (torch.device(device).type == "cuda" or ON_CPU) else "ref"


def long_prefill_backend(device, n_tokens: int) -> str | None:
    """"mamba_ssm" where a prefill of ``n_tokens`` on ``device`` takes mamba_ssm's chunked scan
    and causal_conv1d's conv (USE_MAMBA_SSM, CUDA, at least LONG_PREFILL tokens), else None (the
    engine's own path: the tree ops over a chain, then activation replay)."""
    if USE_MAMBA_SSM and torch.device(device).type == "cuda" and n_tokens >= LONG_PREFILL:
        return "mamba_ssm"
    return None
