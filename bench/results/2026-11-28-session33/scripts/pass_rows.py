# usage: CTX=N .venv/bin/python pass_rows.py 1,4,16 [SECONDS]: median ms of SmolLM2 bf16 C passes of T rows after N tokens of context (with SECONDS: loop T=first for perf record)
import sys, time, statistics
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from engine import native
import torch
from engine.loading import load
m = load("smollm2-135m-instruct", dtype="bf16").model
ctx = int(__import__("os").environ.get("CTX", 300))
m.allocate(ctx + 64)
m.prefill(list(range(100, 100 + ctx)))
tab = m._native_table()
assert tab is not None
rows = [int(r) for r in sys.argv[1].split(",")]
loop = float(sys.argv[2]) if len(sys.argv) > 2 else 0
if loop:
    T = rows[0]; tk = torch.arange(5, 5+T); pos = torch.arange(ctx, ctx+T)
    t0 = time.perf_counter(); n = 0
    while time.perf_counter() - t0 < loop:
        m._native_rows(tab, tk, pos, ctx, None); n += 1
    print(T, "rows", (time.perf_counter()-t0)/n*1e3, "ms"); sys.exit()
res = {T: [] for T in rows}
for _ in range(9):
    for T in rows:
        tk = torch.arange(5, 5+T); pos = torch.arange(ctx, ctx+T)
        m._native_rows(tab, tk, pos, ctx, None)
        t0 = time.perf_counter()
        for _ in range(3): m._native_rows(tab, tk, pos, ctx, None)
        res[T].append((time.perf_counter()-t0)/3*1e3)
for T in rows: print(T, round(statistics.median(res[T]), 2))
