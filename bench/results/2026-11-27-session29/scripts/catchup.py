"""Session 29: a drafter catching up on n new tokens (ModelDrafter._sync) by the C blocks
(advance_fast) against a torch prefill + verify pass, median of 5 (bf16 target's session):

    .venv/bin/python bench/results/2026-11-27-session29/scripts/catchup.py [bf16|q8]
"""
import os, sys, time, statistics
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, ".")
import engine.drafters.model as dm
from engine.session import ChatSession
s = ChatSession.load(dtype=sys.argv[1] if len(sys.argv) > 1 else "bf16")
dr = s.decoder.drafters["model"]
print("| new tokens | C (ms) | torch prefill + verify (ms) |")
hist = list(range(1000, 3000))
for n in (8, 40, 80, 160, 400, 1000):
    row = []
    for limit in (10 ** 6, 0):
        dm.FAST_ADVANCE_MAX = limit
        ts = []
        for _ in range(5):
            dr.reset()
            dr._sync(hist[:100])
            t0 = time.perf_counter()
            dr._sync(hist[:100 + n])
            ts.append(time.perf_counter() - t0)
        row.append(statistics.median(ts) * 1e3)
    print(f"| {n} | {row[0]:.2f} | {row[1]:.2f} |")
