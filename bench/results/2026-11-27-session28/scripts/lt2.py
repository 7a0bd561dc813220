# Session 28: run from the repository root: .venv/bin/python bench/results/2026-11-27-session28/scripts/lt2.py
import time, torch
import sys; sys.path.insert(0, ".")
from engine.loading import load
m = load("smollm2-135m-instruct", dtype="bf16").model
for name in ("wgu", "wd", "wqkv"):
    lins = [L[name] for L in m.layers]; K = lins[0].shape[0]
    res = []
    for n in (4, 5, 6, 7, 8):
        x = torch.randn(n, K); ts = []
        for r in range(30):
            t0 = time.perf_counter()
            for lin in lins: lin(x)
            ts.append((time.perf_counter() - t0) * 1e3)
        ts.sort(); res.append(f"{n}:{ts[3]:.2f}/{ts[15]:.2f}")
    print(name, "30 layers streamed, ms:", " ".join(res))
