# Session 28: run from the repository root: .venv/bin/python bench/results/2026-11-27-session28/scripts/vt2.py 5,6,8 label
import time, statistics, torch, sys
import sys; sys.path.insert(0, ".")
from engine.loading import load
m = load("smollm2-135m-instruct", dtype="bf16").model
g = torch.Generator().manual_seed(0); V = m.vocab_size
m.allocate(512); m.prefill(torch.randint(0, V, (128,), generator=g).tolist())
out = []
for n in [int(x) for x in sys.argv[1].split(",")]:
    toks = torch.randint(0, V, (n,), generator=g).tolist(); par = list(range(-1, n - 1))
    B = []
    for r in range(25):
        m.cache.clear_scratch()
        start, pos, mask = m.cache.extend_plan(par)
        t0 = time.perf_counter(); h = m.forward_rows(torch.tensor(toks), pos, start, mask); t1 = time.perf_counter()
        if mask is not None: m.cache.release_mask(n, start + n)
        B.append((t1-t0)*1e3)
    B.sort()
    out.append(f"{n}:{B[3]:.2f}/{B[12]:.2f}")
print(sys.argv[2] if len(sys.argv) > 2 else "", " ".join(out))
