import sys, time
from engine.loading import load
m = load("smollm2-135m-instruct", dtype="bf16").model
print(m.lm_head_t)
for n in (300, 1500):
    best = 1e9
    for _ in range(3):
        m.allocate(2048)
        t0 = time.perf_counter(); m.prefill(list(range(100, 100 + n))); best = min(best, time.perf_counter() - t0)
    print(n, "tokens prefill %.2f s" % best)
