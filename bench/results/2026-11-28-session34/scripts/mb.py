import time, torch, sys
from engine.models import common
from engine import native
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
for (N, K) in ((49152, 576), (1536, 576), (576, 1536)):
    n_mats = max(1, 60_000_000 // (N * K))  # ~120 MB of bf16: streamed from memory
    lins = [common.Linear.bf16(torch.randn(N, K, generator=g) * 0.05) for _ in range(n_mats)]
    for R in (1, 2, 4, 5, 8, 16):
        x = torch.randn(R, K, generator=g)
        for l in lins: l(x)
        best = 1e9
        for _ in range(5):
            t0 = time.perf_counter()
            for l in lins: l(x)
            best = min(best, time.perf_counter() - t0)
        fma = R * N * K / 8 * n_mats
        print(f"{N}x{K} R={R:2d}: {best*1e3/n_mats:7.3f} ms/mat  {2*N*K*n_mats/best/1e9:6.1f} GB/s  {fma/best/1e9:6.2f} GFMA/s (peak ~2 cores x 2/cycle)", flush=True)
