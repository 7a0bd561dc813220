"""A/B of two versions of the C kernels in one process: SmolLM2's C pass (engine/native/llama_rows.c)
at T rows, the two builds interleaved round by round so the machine's drift hits both alike.

Usage: .venv/bin/python bench/ab_native.py OLD_DIR [--rows 1,2,4,5,6,8,16] [--rounds 15] [--dtype fp32|bf16|q8] [--causal] [--context N]
OLD_DIR holds the baseline's .c files (e.g. `git show REV:engine/native/linear.c > /tmp/old/linear.c`
for each source); the working tree's engine/native is the candidate. Prints per T the median ms of
each build and candidate / baseline. Import order matters: torch's OpenMP reads its wait policy
when it loads, and a team left spinning after a torch op took the pool's second core (a 6-row
pass measured 20 ms instead of 15 that way).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from pathlib import Path

from engine import native  # first: sets OMP_WAIT_POLICY=PASSIVE before torch's OpenMP loads, as the app and CLI do

import torch
from engine.loading import load


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old_dir")
    ap.add_argument("--rows", default="1,2,4,5,6,8,16")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--dtype", default="fp32", help="fp32, bf16 or q8 (8-bit activations, quant_a8.c)")
    ap.add_argument("--causal", action="store_true", help="a causal mask over the T rows (a chain's verify) instead of none")
    a = ap.parse_args()
    new = native.lib()
    assert new is not None, native.status()
    old_dir = Path(a.old_dir)
    srcs = [old_dir / s if (old_dir / s).exists() else native._HERE / s for s in native.SOURCES]
    old = ctypes.CDLL(str(native._build(srcs, "cc")))
    for name in ("llama_rows_f32", "linear_rows_q", "linear_rows_f32", "quant_rows_f32"):
        getattr(old, name).argtypes = getattr(new, name).argtypes
        getattr(old, name).restype = getattr(new, name).restype
    m = load("smollm2-135m-instruct", dtype=a.dtype).model
    m.allocate(a.context + 64)
    m.prefill(list(range(100, 100 + a.context)))
    tab = m._native_table()
    assert tab is not None, "the C pass is off"
    rows = [int(r) for r in a.rows.split(",")]
    times = {(b, T): [] for b in ("old", "new") for T in rows}
    outs = {}
    for _ in range(a.rounds):
        for b, lib in (("old", old), ("new", new)):
            native._lib = lib
            for T in rows:
                x = m._embed_rows(torch.arange(5, 5 + T)).float()  # the pass takes input rows, updated in place
                pos = torch.arange(a.context, a.context + T)
                mask = None
                if a.causal:
                    mask = torch.ones(T, a.context + T, dtype=torch.bool)
                    mask[:, a.context:] = torch.ones(T, T, dtype=torch.bool).tril()
                m._native_rows(tab, x.clone(), pos, a.context, mask)
                t0 = time.perf_counter()
                for _ in range(3):
                    y = m._native_rows(tab, x.clone(), pos, a.context, mask)
                times[(b, T)].append((time.perf_counter() - t0) / 3 * 1e3)
                outs[(b, T)] = y
    native._lib = new
    print(f"SmolLM2 C pass, {a.dtype}, context {a.context}, {torch.get_num_threads()} threads, {a.rounds} rounds (median ms)")
    for T in rows:
        o, n = statistics.median(times[("old", T)]), statistics.median(times[("new", T)])
        same = torch.equal(outs[("old", T)], outs[("new", T)])
        print(f"T={T:3d}  old {o:7.2f}  new {n:7.2f}  new/old {n / o:5.2f}  bits equal: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
