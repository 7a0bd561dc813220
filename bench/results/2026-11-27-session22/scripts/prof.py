import sys, engine, torch, time
from engine.session import ChatSession
s = ChatSession.load(dtype="bf16")
m = s.decoder.target
g = torch.Generator().manual_seed(0)
m.allocate(400); m.prefill(torch.randint(0, 49152, (300,), generator=g).tolist())
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
toks = list(range(5, 5 + n)); par = list(range(-1, n - 1))
with torch.inference_mode():
    for _ in range(5): m.verify(toks, par)
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10): m.verify(toks, par)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))
