import torch, time, sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
from engine.sampling import top_values
from engine import native
print(native.status())
torch.manual_seed(0)
for R in (1, 16):
    x = torch.softmax(torch.randn(R, 49152) * 3, -1)
    for k in (40, 256):
        assert torch.equal(top_values(x, k), x.topk(k, -1).values)
        for f, name in ((lambda: x.topk(k, dim=-1).values, "torch"), (lambda: top_values(x, k), "C")):
            for _ in range(20): f()
            t = time.perf_counter(); n = 300
            for _ in range(n): f()
            print(f"R={R} k={k} {name}: {(time.perf_counter() - t) / n * 1e6:.0f} us")
