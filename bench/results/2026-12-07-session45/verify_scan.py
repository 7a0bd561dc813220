import time, statistics, torch, sys
from engine.session import ChatSession
s = ChatSession.load(dtype="bf16", drafter="none")
if len(sys.argv) > 1: torch.set_num_threads(int(sys.argv[1]))
m = s.decoder.target
V = m.vocab_size
g = torch.Generator().manual_seed(0)
m.allocate(1024)
m.prefill(torch.randint(0, V, (100,), generator=g).tolist())
def med(fn, r=25):
    fn(); xs=[]
    for _ in range(r):
        t0=time.perf_counter(); fn(); xs.append((time.perf_counter()-t0)*1000)
    return statistics.median(xs)
out=[]
for n in (1,4,5,6,7,8,12,16):
    toks = torch.randint(0, V, (n,), generator=g).tolist()
    out.append(f"{n}:{med(lambda: m.verify(toks, list(range(-1, n - 1)))):.2f}")
print(torch.get_num_threads(), " ".join(out))
