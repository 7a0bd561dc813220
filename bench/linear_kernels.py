"""fp32 products through engine/native/linear.c against oneDNN's packed GEMM, same process, at the
shapes of SmolLM2-135M and the shipped drafter, 1-256 rows (min of 50 runs, ms).

Usage: .venv/bin/python bench/linear_kernels.py   (set OMP_WAIT_POLICY / threads as you measure)
"""

from __future__ import annotations

import time

import torch

from engine.models import common


def best_ms(f, n: int = 50) -> float:
    for _ in range(5):
        f()
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> int:
    print(f"threads {torch.get_num_threads()}; probe: {common.native_linear_status()}")
    rows = (1, 2, 4, 8, 16, 32, 256)
    print("in x out".ljust(12) + "".join(f"{r:>16}" for r in rows) + "   (native / oneDNN ms)")
    for k, n in [(576, 1536), (1536, 576), (576, 576), (576, 192), (480, 11327), (576, 49152)]:
        W = torch.randn(n, k)
        nat = common.Linear(W, torch.float32, native=True)
        ref = common.Linear(W, torch.float32, native=False)
        x = torch.randn(256, k)
        cells = [f"{best_ms(lambda: nat(x[:r])):.3f}/{best_ms(lambda: ref(x[:r])):.3f}" for r in rows]
        print(f"{k}x{n}".ljust(12) + "".join(f"{c:>16}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
