import sys, engine, torch, time, statistics
import engine.models.llama as LL
from engine.session import ChatSession
s = ChatSession.load(dtype="bf16")
m = s.decoder.target
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, 49152, (300,), generator=g).tolist()
m.allocate(400); m.prefill(ids)
ns = [int(a) for a in sys.argv[1:]] or [1, 2, 4, 6, 8, 16]
res = {(gl, n): [] for gl in (0, 1) for n in ns}
with torch.inference_mode():
  for rep in range(10):
    for gl in (0, 1):
      LL.GLUE_BF16 = bool(gl); m.__dict__.pop("_glue_lib", None)
      for n in ns:
        toks, par = list(range(5, 5 + n)), list(range(-1, n - 1))
        m.verify(toks, par)
        ts = []
        for _ in range(4):
            t0 = time.perf_counter(); m.verify(toks, par); ts.append(time.perf_counter() - t0)
        res[gl, n].append(min(ts) * 1000)
for n in ns:
    a, b = statistics.median(res[0, n]), statistics.median(res[1, n])
    print(f"n={n:2d} torch {a:6.2f} glue {b:6.2f} ms  ratio {b/a:.3f}")
