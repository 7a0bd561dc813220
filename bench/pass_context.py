"""SmolLM2's C pass (layers, no head) at 1 and 6 rows over contexts of 100-2,000 cached tokens:
median ms of 25 calls. At one row a pass reads the weights and the whole KV cache, so the
context's share grows with its length; the cache's dtype comes first on the line.

Usage: .venv/bin/python bench/pass_context.py [--dtype q8]
To compare two versions, run it from each tree alternately (PYTHONPATH=<tree>).
"""

from __future__ import annotations

import argparse
import statistics
import time

from engine import native  # noqa: F401 - first: the engine's OpenMP wait policy before torch loads

import torch

from engine.loading import load


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="q8")
    a = ap.parse_args()
    m = load("smollm2-135m-instruct", dtype=a.dtype).model
    out = {}
    for ctx in (100, 400, 1200, 2000):
        m.allocate(ctx + 64)
        m.prefill(list(range(100, 100 + ctx)))
        tab = m._native_table()
        assert tab is not None, "the C pass is off"
        for T in (1, 6):
            tk, pos = torch.arange(5, 5 + T), torch.arange(ctx, ctx + T)
            ts = []
            for _ in range(25):
                t0 = time.perf_counter()
                m._native_rows(tab, tk, pos, ctx, None)
                ts.append((time.perf_counter() - t0) * 1e3)
            out[(ctx, T)] = statistics.median(ts)
    print(str(m.cache.k.dtype).ljust(15), "  ".join(f"c{c}/T{T}: {v:.2f}" for (c, T), v in out.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
