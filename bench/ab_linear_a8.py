"""A/B of the q8 compute type's products (engine/native/quant_a8.c via ``linear_rows_q``) between
builds of the C sources, in one process, calls interleaved build after build so the machine's
drift hits every build alike: min ms of N calls per shape and row count, the bits compared, and
the sum over one SmolLM2-135M pass (bench/quant_kernels.py's shapes and counts).

Usage: .venv/bin/python bench/ab_linear_a8.py DIR [DIR ...] [--rows 1,2,4,8,16] [--reps 25]
Each DIR holds the .c/.h files that replace engine/native's in that build (an empty directory is
the working tree; ``git show REV:engine/native/quant_a8.c > DIR/quant_a8.c`` and a copy of pool.h
make REV's). On this noisy VM, one thread (OMP_NUM_THREADS=1) ranks builds more steadily.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

from engine import native  # first: the engine's OpenMP wait policy before torch loads

import torch
from quant_kernels import SHAPES  # bench/ is the script's directory

from engine.models.quant import QTYPES, pack, quantize_rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=25)
    a = ap.parse_args()
    base = native.lib()
    assert base is not None, native.status()
    libs = []
    for d in a.dirs:
        srcs = [Path(d) / s if (Path(d) / s).exists() else native._HERE / s for s in native.SOURCES]
        lib = ctypes.CDLL(str(native._build(srcs, "cc")))
        lib.linear_rows_q.argtypes, lib.linear_rows_q.restype = base.linear_rows_q.argtypes, base.linear_rows_q.restype
        libs.append(lib)
    rows = [int(r) for r in a.rows.split(",")]
    nt = torch.get_num_threads()
    torch.manual_seed(0)
    total = {(i, R): 0.0 for i in range(len(libs)) for R in rows}
    print(f"threads {nt}; per shape and rows: min ms of {a.reps} calls, builds in the order given")
    for K, N, qt, count in SHAPES:
        kt = qt + "a8"
        rec = pack(quantize_rows(torch.randn(N, K) * 0.05, qt), kt, K)
        x = torch.randn(max(rows), K)
        line = f"{K}x{N} {qt}".ljust(18)
        for R in rows:
            best, outs = [float("inf")] * len(libs), [torch.empty(R, N) for _ in libs]
            for _ in range(a.reps):
                for i, lib in enumerate(libs):
                    t0 = time.perf_counter()
                    lib.linear_rows_q(x.data_ptr(), K, R, K, rec.data_ptr(), QTYPES[kt], N, None, outs[i].data_ptr(), nt)
                    best[i] = min(best[i], time.perf_counter() - t0)
            for i in range(len(libs)):
                total[(i, R)] += best[i] * count * 1e3
            same = all(torch.equal(outs[0], o) for o in outs)
            line += f"  R{R}: " + "/".join(f"{b * 1e3:.3f}" for b in best) + ("" if same else " BITS DIFFER")
        print(line)
    for R in rows:
        print(f"pass linears, {R:2d} rows: " + "  ".join(f"{total[(i, R)]:7.2f}" for i in range(len(libs))) + " ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
