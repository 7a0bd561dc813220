"""A drafter's greedy chain (ModelDrafter/BridgeDrafter.propose at one position, 200 times) at 1 and 2
kernel threads, and its C blocks / head alone.

    .venv/bin/python bench/results/2026-11-28-session35/scripts/micro.py assets/mamba-drafter-smollm2 5
"""
import sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from engine.session import ChatSession
from engine.drafters.base import DraftRequest
from engine import native
drafter = sys.argv[1]; k = int(sys.argv[2])
s = ChatSession.load(drafter=drafter, strategy=f"sd:{k}", dtype="bf16")
d = s.decoder.drafters["model"]
inner = getattr(d, "inner", None) or getattr(d, "drafter", None) or d
print(type(d).__name__, type(inner).__name__)
m = inner.model if hasattr(inner, "model") else None
hist = s.encode_chat([{"role": "user", "content": "Write a short story about a robot who learns to paint, in three paragraphs."}])
req = DraftRequest(shape=(1,) * k)
for threads in (1, 2, 1, 2):
    with native.capped(threads):
        d.propose(hist, req)
        t = time.perf_counter(); n = 200
        for _ in range(n): tr = d.propose(hist, req)
        dt = (time.perf_counter() - t) / n * 1000
    print(f"threads {threads}: propose chain {k}: {dt:.3f} ms ({dt/k:.3f}/token) tree {len(tr)}")
# C-only: the step
from engine.models.common import fast_rows
if hasattr(inner, "model"):
  with fast_rows():
    mm = inner.model
    if True:
      b = mm.fork(1)
      tok = torch.tensor([65])
      for threads in (1, 2):
          with native.capped(threads):
              t = time.perf_counter()
              for _ in range(500): b.step(tok)
              print(f"threads {threads}: batch.step {(time.perf_counter()-t)/500*1000:.3f} ms")
              conv, ssm = b.state["conv"], b.state["ssm"]
              x = mm.embed[tok].float().contiguous()
              lib = mm._native_step(conv, ssm)
              t = time.perf_counter()
              for _ in range(500): mm._c_layers(lib, x.clone(), 1, 1, conv, ssm)
              print(f"threads {threads}: c_layers {(time.perf_counter()-t)/500*1000:.3f} ms")
              h = torch.randn(1, mm.cfg.hidden_size)
              t = time.perf_counter()
              for _ in range(500): mm.logits(h)
              print(f"threads {threads}: logits {(time.perf_counter()-t)/500*1000:.3f} ms")
