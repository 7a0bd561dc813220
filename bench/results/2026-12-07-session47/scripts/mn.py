import torch, time
g = torch.Generator().manual_seed(0)
p = torch.softmax(torch.randn(49152) * 3, -1)
def inv(p, g):
    c = torch.cumsum(p, 0, dtype=torch.float64)
    u = torch.rand((), generator=g, dtype=torch.float64) * c[-1]
    return int(torch.searchsorted(c, u.reshape(1), right=True))
for name, f in (("multinomial", lambda: int(torch.multinomial(p, 1, generator=g))), ("inverse cdf", lambda: inv(p, g))):
    for _ in range(20): f()
    t = time.perf_counter(); n = 500
    for _ in range(n): f()
    print(name, f"{(time.perf_counter() - t) / n * 1e6:.0f} us")
p8 = torch.softmax(torch.randn(8192) * 3, -1)
t = time.perf_counter()
for _ in range(500): torch.multinomial(p8, 3, generator=g)
print("mn 8192 k=3 norepl", (time.perf_counter() - t) / 500 * 1e6)
