"""One bf16 product (engine/native/bf16_rows.c through Linear._native) of R rows for SmolLM2's
three weight shapes: best / 5th of 15 runs of 5 calls. SPECCHAT_BF16_CHUNK=N forces the AVX2
path's row chunk (0: none).

    .venv/bin/python bench/results/2026-11-28-session36/scripts/products.py 256
"""
import sys, time, torch, os
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from engine.models.common import Linear
from engine import native
torch.manual_seed(0)
R = int(sys.argv[1])
res = []
for K, N in ((576, 3072), (1536, 576), (576, 960)):
    lin = Linear.bf16(torch.randn(N, K) * 0.05)
    x = torch.randn(R, K)
    lin._native(x, None)
    ts = []
    for _ in range(15):
        t = time.perf_counter()
        for _ in range(5): lin._native(x, None)
        ts.append((time.perf_counter() - t) / 5)
    ts.sort()
    res.append(f"{K}x{N}: {ts[0]*1e3:.2f}/{ts[4]*1e3:.2f} ms {R*K*N/ts[0]/1e9:.1f} GMAC/s")
print(os.environ.get("SPECCHAT_BF16_CHUNK", "default"), R, " | ".join(res), flush=True)
