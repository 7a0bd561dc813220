import sys, time, torch
sys.path.insert(0, sys.argv[1])
from engine.sampling import draw_rows
g = torch.Generator().manual_seed(0)
p = torch.softmax(torch.randn(48, 49152, generator=g) * 3, -1)
for tp in (1.0, 0.9):
    for _ in range(3): draw_rows(p, tp, g)
    t = time.perf_counter()
    for _ in range(20): draw_rows(p, tp, g)
    print(sys.argv[1], "top_p", tp, f"{(time.perf_counter() - t) / 20 * 1e3:.1f} ms for 48 rows")
