"""SmolLM2-135M's linears alone through the C products (engine/native), all 30 layers of one matrix
kind in a row, median of 15: `PYTHONPATH=<tree> python lin.py bf16|auto 1,4,8,16`."""
import sys, time, ctypes
from engine import native
import torch
from engine.loading import load
dt = sys.argv[1] if len(sys.argv) > 1 else "bf16"
m = load("smollm2-135m-instruct", dtype=dt).model
tab = m._native_table()
lib = native.lib()
c = m.cfg
D, F = c.hidden_size, c.intermediate_size
QKV = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
S = dict(WQKV=2, QQKV=3, WO=5, QO=6, WGU=8, QGU=9, WD=11, QD=12)
shapes = {"qkv": (2, 3, D, QKV), "o": (5, 6, D, D), "gu": (8, 9, D, 2 * F), "d": (11, 12, F, D)}
nt = native.threads()
for R in [int(r) for r in sys.argv[2].split(",")]:
    res = {}
    for name, (w, q, K, N) in shapes.items():
        x = torch.randn(R, K); y = torch.empty(R, N)
        def run():
            for l in range(tab.shape[0]):
                rc = lib.linear_rows_q(x.data_ptr(), K, R, K, int(tab[l, w]), int(tab[l, q]), N, None, y.data_ptr(), nt)
                assert rc == 0, rc
        run()
        ts = []
        for _ in range(15):
            t0 = time.perf_counter(); run(); ts.append(time.perf_counter() - t0)
        ts.sort(); res[name] = ts[len(ts)//2] * 1e3
    tot = sum(res.values())
    print(f"R={R:2d} " + " ".join(f"{k} {v:.3f}" for k, v in res.items()) + f"  total {tot:.3f} ms")
