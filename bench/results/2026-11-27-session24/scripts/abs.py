import sys; sys.path.insert(0, "/work/main"); import engine
import time, statistics
from engine import native
from engine.loading import load
from engine.registry import load_registry
lib = native.lib()
dtype = sys.argv[1]
m = load("smollm2-135m-instruct", dtype=dtype, registry=load_registry(None)).model
m.allocate(8192)
ids = [(i * 7919) % 40000 + 100 for i in range(4000)]
def prefill(n):
    m.rollback(0); t = time.perf_counter(); m.prefill(ids[:n]); return time.perf_counter() - t
def steps(R, reps):
    chain = [(i * 31) % 30000 + 100 for i in range(R)]; par = list(range(-1, R - 1)); ts = []
    for _ in range(reps):
        t = time.perf_counter(); m.verify(chain, par); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1000
res = {}
for rep in range(3):
    for split in (0, int(sys.argv[2])):
        lib.llama_rows_set_split(split)
        res.setdefault((split, "prefill1500 s"), []).append(prefill(1500))
        for ctx in (600, 1500, 3000):
            m.rollback(0); m.prefill(ids[:ctx])
            for R in (1, 6):
                res.setdefault((split, f"ctx{ctx} rows{R} ms"), []).append(steps(R, 30))
keys = sorted({k for _, k in res})
for k in keys:
    a, b = statistics.median(res[(0, k)]), statistics.median(res[(int(sys.argv[2]), k)])
    print(f"{dtype} {k:20s} unsplit {a:8.3f}  split {b:8.3f}  ratio {b / a:.3f}")
