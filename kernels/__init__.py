"""Triton kernels, one op per file (STYLE.md item 4): ``_op_kernel``, the launcher ``op`` and
``op_ref`` in plain PyTorch with the same signature.

Flags, resolved once here (STYLE.md item 9: never a ``None`` left by a failed import):

    HAS_TRITON   triton is installed
    USE_TRITON   the engine runs the kernels on CUDA tensors: HAS_TRITON, unless the environment
                 says SPECCHAT_TRITON=0 (then the PyTorch path runs on CUDA too, for comparison)
    ON_CPU       tests only: run the kernels on CPU tensors as well, under Triton's interpreter
                 (TRITON_INTERPRET=1 must be set before triton is imported; tests/kernels does)

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


def use_triton(t: torch.Tensor) -> bool:
    """Whether the engine runs the Triton op for tensor ``t`` (a CUDA tensor, or any under ON_CPU)."""
    return USE_TRITON and (t.is_cuda or ON_CPU)


def backend(device) -> str:
    """"triton" where ``use_triton`` holds for a tensor on ``device``, else "ref"."""
    return "triton" if USE_TRITON and (torch.device(device).type == "cuda" or ON_CPU) else "ref"
