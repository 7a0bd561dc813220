import sys; root = sys.argv[1]; sys.path.insert(0, root); import engine
import time, statistics, json
from engine.loading import load
from engine.registry import load_registry
dtype = sys.argv[2]
m = load("smollm2-135m-instruct", dtype=dtype, registry=load_registry(None)).model
m.allocate(4096)
res = {}
ids = [(i * 7919) % 40000 + 100 for i in range(1500)]
def prefill():
    m.rollback(0); t = time.perf_counter(); m.prefill(ids); return time.perf_counter() - t
res["prefill1500"] = statistics.median([prefill() for _ in range(3)])
m.rollback(300)
for R in (1, 6, 16):
    chain = [(i * 31) % 30000 + 100 for i in range(R)]
    par = list(range(-1, R - 1)); ts = []
    for _ in range(40 if R > 1 else 100):
        t = time.perf_counter(); m.verify(chain, par); ts.append(time.perf_counter() - t)
    res[f"ctx300_rows{R}"] = statistics.median(ts) * 1000
m.rollback(0); m.prefill(ids[:1400])
for R in (1, 6):
    chain = [(i * 31) % 30000 + 100 for i in range(R)]
    par = list(range(-1, R - 1)); ts = []
    for _ in range(40):
        t = time.perf_counter(); m.verify(chain, par); ts.append(time.perf_counter() - t)
    res[f"ctx1400_rows{R}"] = statistics.median(ts) * 1000
print(json.dumps({k: round(v, 3) for k, v in res.items()}))
