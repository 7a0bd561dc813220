import sys, time, statistics, os
import engine, torch
from engine.loading import load
from engine import native
m = load("smollm2-135m-instruct", dtype=sys.argv[1] if len(sys.argv)>1 else "bf16").model
print(m.lm_head_t, native.threads(), os.environ.get("OMP_WAIT_POLICY"))
m.allocate(600); m.prefill(list(range(100, 400)))
def step(t):
    lg = m.verify([t], [-1]); m.commit([0]); return int(lg[0].argmax())
t=5
for _ in range(10): t=step(t)
s=[]
for _ in range(40):
    t0=time.perf_counter(); t=step(t); s.append(time.perf_counter()-t0)
print("decode %.2f ms"%(statistics.median(s)*1e3))
for n in (2,4,6,8,12,16):
    ts=[]
    for _ in range(9):
        t0=time.perf_counter(); m.verify([5+i for i in range(n)], list(range(-1,n-1))); ts.append(time.perf_counter()-t0)
    print(n, "rows %.2f ms"%(statistics.median(ts)*1e3))
