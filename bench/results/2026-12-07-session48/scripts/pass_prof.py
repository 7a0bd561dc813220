"""One C pass of T rows (causal mask) + the head, n times, for perf: `CTX=300 perf record python pass_prof.py T n [bf16|auto]`."""
import sys, time
from engine import native
import torch
from engine.loading import load
import os
T = int(sys.argv[1]); n = int(sys.argv[2]); ctx = int(os.environ.get("CTX", "300"))
m = load("smollm2-135m-instruct", dtype=sys.argv[3] if len(sys.argv) > 3 else "bf16").model
m.allocate(ctx + 64); m.prefill(list(range(100, 100 + ctx)))
tk = torch.arange(5, 5 + T); pos = torch.arange(ctx, ctx + T)
mask = torch.ones(T, ctx + T, dtype=torch.bool); mask[:, ctx:] = torch.ones(T, T, dtype=torch.bool).tril()
def one():
    h = m.forward_rows(tk, pos, ctx, mask)
    return m.logits(h)
for _ in range(5): one()
t0 = time.perf_counter(); tb = 0
for _ in range(n):
    h = m.forward_rows(tk, pos, ctx, mask)
    t1 = time.perf_counter(); m.logits(h); tb += time.perf_counter() - t1
print(T, "total %.3f ms  head %.3f ms" % ((time.perf_counter() - t0) / n * 1e3, tb / n * 1e3))
