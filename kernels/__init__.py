"""Triton kernels, one op per file (STYLE.md item 4): ``_op_kernel``, the launcher ``op`` and
``op_ref`` in plain PyTorch with the same signature.

``HAS_TRITON`` is resolved once here (STYLE.md item 9: never a ``None`` left by a failed import).
On a CPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is
imported), which is how CI checks them against their references; the engine uses the references
on CPU and the kernels on CUDA.
"""

from __future__ import annotations

import importlib.util

HAS_TRITON = importlib.util.find_spec("triton") is not None


def backend(device) -> str:
    """"triton" for a CUDA tensor when Triton is installed, else "ref"."""
    import torch

    return "triton" if HAS_TRITON and torch.device(device).type == "cuda" else "ref"
