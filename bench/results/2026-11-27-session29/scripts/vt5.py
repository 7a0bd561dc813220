"""Session 29: the body of a bf16 pass (the target's forward_rows) at each row count, with the time
of each phase inside the C pass (norms/rotary/SiLU/adds, the four products, attention), medians of
31, 128 tokens of context. Needs the timers of llama_rows_timers.patch (git apply it, run, then
git checkout engine/native/llama_rows.c):

    .venv/bin/python bench/results/2026-11-27-session29/scripts/vt5.py 1,6,16 nohead|head
"""
import os, sys, time, ctypes
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, ".")
import torch
from engine.loading import load
from engine import native
m = load("smollm2-135m-instruct", dtype=os.environ.get("VT_DTYPE", "bf16")).model
g = torch.Generator().manual_seed(0)
V = m.vocab_size
m.allocate(512)
m.prefill(torch.randint(0, V, (128,), generator=g).tolist())
lib = native.lib(); buf = (ctypes.c_double * 8)()
names = ["glue", "qkv", "att", "wo", "wgu", "wd"]
with_head = sys.argv[2] == "head"
for n in [int(x) for x in sys.argv[1].split(",")]:
    toks = torch.tensor(torch.randint(0, V, (n,), generator=g).tolist())
    parents = list(range(-1, n - 1))
    rows = []
    for _ in range(31):
        m.cache.clear_scratch()
        start, pos, mask = m.cache.extend_plan(parents)
        lib.lr_prof_get(buf)
        t0 = time.perf_counter()
        h = m.forward_rows(toks, pos, start, mask)
        t1 = time.perf_counter()
        lib.lr_prof_get(buf); b = list(buf)[:6]
        if with_head:
            m.logits(h)
        rows.append([(t1 - t0) * 1e3] + b)
        if mask is not None:
            m.cache.release_mask(n, start + n)
    med = [sorted(r[i] for r in rows)[15] for i in range(7)]
    print(sys.argv[2], n, f"body {med[0]:.2f}", " ".join(f"{k}={v:.2f}" for k, v in zip(names, med[1:])))
