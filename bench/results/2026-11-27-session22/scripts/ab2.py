import sys, engine, torch, time, statistics
import engine.models.common as C
from engine.session import ChatSession
s = ChatSession.load(dtype="bf16")
m = s.decoder.target
g = torch.Generator().manual_seed(0)
m.allocate(400); m.prefill(torch.randint(0, 49152, (300,), generator=g).tolist())
res = {2: [], 3: [], 4: []}
with torch.inference_mode():
  for rep in range(12):
    for minr in (2, 4, 3):
        C._PAD_ROWS[torch.bfloat16] = minr  # (measured with an earlier name of this variable)
        m.verify([5], [-1])
        ts = []
        for _ in range(8):
            t0 = time.perf_counter(); m.verify([5], [-1]); ts.append(time.perf_counter() - t0)
        res[minr].append(min(ts) * 1000)
for k, v in res.items(): print(k, f"median-of-mins {statistics.median(v):.2f} min {min(v):.2f}")
