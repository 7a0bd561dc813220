"""The bf16 verify pass (body and head apart) at 1, 8, 16 rows, 300 tokens of context, medians of 45."""
import sys, time, statistics
from engine import native
import torch
from engine.loading import load
ctx = 300
m = load("smollm2-135m-instruct", dtype="bf16").model
m.allocate(ctx + 64); m.prefill(list(range(100, 100 + ctx)))
ns = [1, 8, 16]
tf = {n: [] for n in ns}; th = {n: [] for n in ns}
for rnd in range(15):
    for n in ns:
        mk = torch.ones(n, ctx + n, dtype=torch.bool); mk[:, ctx:] = torch.ones(n, n, dtype=torch.bool).tril()
        tk = torch.arange(5, 5 + n); pos = torch.arange(ctx, ctx + n)
        for _ in range(3):
            t0 = time.perf_counter(); h = m.forward_rows(tk, pos, ctx, mk); t1 = time.perf_counter(); m.logits(h); t2 = time.perf_counter()
            tf[n].append((t1 - t0) * 1e3); th[n].append((t2 - t1) * 1e3)
print(" ".join(f"{n}: body {statistics.median(tf[n]):.2f} head {statistics.median(th[n]):.2f}" for n in ns))
