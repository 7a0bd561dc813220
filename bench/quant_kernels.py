"""GGUF-block products (engine/native/linear.c ``linear_rows_q``) at SmolLM2-135M's fused shapes,
1-24 rows: ms (min of N runs) and GFLOP/s, plus the sum over one model pass (30 layers of
qkv / o / gate-up / down in Q4_1 and the 576 x 49152 Q8_0 head) -- the linear part of t(R).

Usage: .venv/bin/python bench/quant_kernels.py [--rows 1,2,4,6,8,12,16,24] [--a8]
(--a8: the q8 compute type's records, 8-bit activations and integer dot products, quant_a8.c)
"""

from __future__ import annotations

import argparse

import engine  # noqa: F401 - first: the engine's OMP_WAIT_POLICY default before torch's OpenMP loads
import torch
from linear_kernels import best_ms  # bench/ is the script's directory

from engine.models.common import Linear
from engine.models.quant import pack, quantize_rows

# (K, N, qtype, count per pass)
SHAPES = [(576, 960, "Q4_1", 30), (576, 576, "Q4_1", 30), (576, 3072, "Q4_1", 30), (1536, 576, "Q4_1", 30), (576, 49152, "Q8_0", 1)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,4,5,6,8,12,16,24")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--a8", action="store_true", help="the q8 compute type (engine/native/quant_a8.c)")
    a = ap.parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    torch.manual_seed(0)
    total = {r: 0.0 for r in rows}
    print(f"threads {torch.get_num_threads()}, {'q8 (8-bit activations)' if a.a8 else 'fp32'}")
    print("K x N qtype".ljust(20) + "".join(f"{r:>14}" for r in rows) + "   (ms / GFLOP/s)")
    for K, N, qt, count in SHAPES:
        W = torch.randn(N, K) * 0.05
        kt = qt + "a8" if a.a8 else qt
        lin = Linear.quantized(pack(quantize_rows(W, qt), kt, K), kt, K, N)
        x = torch.randn(max(rows), K)
        cells = []
        for r in rows:
            ms = best_ms(lambda: lin(x[:r]), a.runs if N < 10000 else max(5, a.runs // 3))
            total[r] += ms * count
            cells.append(f"{ms:.3f}/{2 * r * K * N / ms / 1e6:.0f}")
        print(f"{K}x{N} {qt}".ljust(20) + "".join(f"{c:>14}" for c in cells), flush=True)
    print("pass linears ms".ljust(20) + "".join(f"{total[r]:>14.2f}" for r in rows))
    print("ratio to 1 row".ljust(20) + "".join(f"{total[r] / total[rows[0]]:>14.2f}" for r in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
