"""bf16 prefill of 256 and 1,024 random tokens (best of 3 each) and a hash of two verify passes'
logits; run it with and without SPECCHAT_BF16_CHUNK=0 (one row chunk: the AVX2 path before
session 36) in turn:

    for i in 1 2 3; do SPECCHAT_BF16_CHUNK=0 .venv/bin/python bench/results/2026-11-28-session36/scripts/prefill_ab.py; .venv/bin/python bench/results/2026-11-28-session36/scripts/prefill_ab.py; done
"""
import sys, time, torch, hashlib, os
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from engine.session import ChatSession
s = ChatSession.load(drafter="none", strategy="ar", dtype="bf16")
m = s.target.model
g = torch.Generator().manual_seed(0)
ids = torch.randint(100, 40000, (1100,), generator=g).tolist()
out = []
for n in (256, 1024):
    best = 1e9
    for r in range(3):
        m.rollback(0); t = time.perf_counter(); m.prefill(ids[:n]); best = min(best, time.perf_counter() - t)
    out.append(f"prefill {n}: {best*1e3:.0f} ms ({n/best:.0f} tok/s)")
lg = m.verify(ids[1024:1030], list(range(-1, 5)))
m.rollback(0); m.prefill(ids[:37]); lg2 = m.verify(ids[37:45], list(range(-1, 7)))
h = hashlib.sha1(lg.float().numpy().tobytes() + lg2.float().numpy().tobytes()).hexdigest()[:12]
print(os.environ.get("SPECCHAT_BF16_CHUNK", "default"), " | ".join(out), "logits", h, flush=True)
