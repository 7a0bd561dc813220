"""Session 28: the body of a bf16 verify pass (the target's ``forward_rows``) at n rows after a
PREFIX-token context (default 128), 25 repeats; prints the 4th-fastest / median ms per n.

    .venv/bin/python bench/results/2026-11-27-session28/scripts/vt2.py 5,6,8 LABEL [PREFIX]
"""
import os
import sys
import time

# Session 29: torch read OMP_WAIT_POLICY at import, before engine/__init__.py set it to PASSIVE, so
# this script first ran with libgomp's default spinning waits, the state in which the pass is slow
# and bimodal from 6 rows on (torch's spinning worker takes the pool's second core for ~4 ms at a
# time). The engine's commands never run so; set it here as they do.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, ".")
from engine.loading import load  # noqa: E402

sizes = [int(x) for x in sys.argv[1].split(",")]
label = sys.argv[2] if len(sys.argv) > 2 else ""
prefix = int(sys.argv[3]) if len(sys.argv) > 3 else 128
m = load("smollm2-135m-instruct", dtype="bf16").model
g = torch.Generator().manual_seed(0)
V = m.vocab_size
m.allocate(512)
m.prefill(torch.randint(0, V, (prefix,), generator=g).tolist())
out = []
for n in sizes:
    toks = torch.tensor(torch.randint(0, V, (n,), generator=g).tolist())
    parents = list(range(-1, n - 1))
    ms = []
    for _ in range(25):
        m.cache.clear_scratch()
        start, pos, mask = m.cache.extend_plan(parents)
        t0 = time.perf_counter()
        m.forward_rows(toks, pos, start, mask)
        ms.append((time.perf_counter() - t0) * 1e3)
        if mask is not None:
            m.cache.release_mask(n, start + n)
    ms.sort()
    out.append(f"{n}:{ms[3]:.2f}/{ms[12]:.2f}")
print(label, " ".join(out))
