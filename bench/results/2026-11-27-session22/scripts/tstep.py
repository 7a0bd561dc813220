import engine, torch, time, statistics
from engine.session import ChatSession
s = ChatSession.load(dtype="bf16")
m = s.decoder.target
g = torch.Generator().manual_seed(0)
m.allocate(400); m.prefill(torch.randint(0, 49152, (300,), generator=g).tolist())
with torch.inference_mode():
    h = torch.randn(1, 576).bfloat16()
    for name, f in [("step", lambda: m.verify([5], [-1])), ("head", lambda: m.logits(h)), ("fwd", lambda: m.forward_rows(torch.tensor([5]), torch.tensor([300]), 300, None))]:
        ts = []
        for _ in range(30):
            t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
        print(name, f"{statistics.median(ts)*1000:.2f} ms")
