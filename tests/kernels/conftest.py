"""Kernel tests run on a GPU when there is one, else under Triton's interpreter on the CPU (the
variable must be set before triton is imported, hence here)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
