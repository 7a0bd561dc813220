import sys, engine, torch, time, statistics
import engine.models.common as C
from engine.session import ChatSession
s = ChatSession.load(dtype="bf16")
m = s.decoder.target
g = torch.Generator().manual_seed(0)
m.allocate(400); m.prefill(torch.randint(0, 49152, (300,), generator=g).tolist())
ns = [1, 2, 3, 4]
res = {(p, n): [] for p in (2, 4) for n in ns}
with torch.inference_mode():
  for rep in range(12):
    for p in (2, 4):
      C._PAD_ROWS[torch.bfloat16] = p
      for n in ns:
        toks, par = list(range(5, 5 + n)), list(range(-1, n - 1))
        m.verify(toks, par)
        ts = []
        for _ in range(4):
            t0 = time.perf_counter(); m.verify(toks, par); ts.append(time.perf_counter() - t0)
        res[p, n].append(min(ts) * 1000)
for n in ns:
    a, b = statistics.median(res[2, n]), statistics.median(res[4, n])
    print(f"n={n} pad2 {a:6.2f} pad4 {b:6.2f} ms ratio {b/a:.3f}")
