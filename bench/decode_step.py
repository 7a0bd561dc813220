"""Decode-step and verify-pass times of the default target (SmolLM2-135M-Instruct, bf16 or fp32) under
the CPU hot-path switches, each configuration in its own process (the switches are read at import):

    SPECCHAT_PACKED=0   projections through plain ``x @ W_t`` instead of oneDNN's pre-packed weights
    SPECCHAT_NATIVE=0   the torch blockwise attention instead of the C kernel (engine/native)
    SPECCHAT_NATIVE_LINEAR=1  fp32 projections through engine/native/linear.c (row-consistent)
    SPECCHAT_QUANT=1    ... with the GGUF's Q4_1 / Q8_0 matrices kept in their blocks (bit-identical)
    SPECCHAT_NATIVE_ROWS=1  ... and the whole pass in one C call (engine/native/llama_rows.c)
    SPECCHAT_PAD_ROWS=2     bf16 products of 1-3 rows run as 2 rows (else as many as the machine's probe chose)
    SPECCHAT_NATIVE_GLUE=0  bf16 norms, rotary, SiLU, residual adds as torch ops (else engine/native/glue_bf16.c)
    SPECCHAT_NATIVE_BF16=1  bf16: the C pass with bf16 records (engine/native/bf16_rows.c; needs SPECCHAT_NATIVE_ROWS=1)

Usage: .venv/bin/python bench/decode_step.py [--context 300] [--steps 60] [--dtype bf16|fp32|q8] [--last N]
(q8: the GGUF blocks' products with 8-bit activations, engine/native/quant_a8.c; its last configuration)
Prints one line per configuration: ms per 1-token decode step and per verify pass of 4 / 6 / 16 chain
rows and a 46-node (3,2,2,1,1) tree, medians, and the tree pass's mean time inside attention;
OMP_WAIT_POLICY as given, else the engine's default (PASSIVE; with the C pass's own thread pool, ACTIVE
makes torch's team spin on the pool's second core).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, time
import engine  # first: its OMP_WAIT_POLICY default (PASSIVE) must be in place before torch's OpenMP loads
import torch
from engine.loading import load
from engine.policy import plan_from_shape
from engine.models import common
from engine import native
import engine.models.llama as llama
ctx, steps, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
attn = [0.0]
_orig = llama.cached_attention
def _timed(*a, **k):  # the attention's share of a pass (one wrapper call per layer)
    t0 = time.perf_counter(); r = _orig(*a, **k); attn[0] += time.perf_counter() - t0; return r
llama.cached_attention = _timed
m = load("smollm2-135m-instruct", dtype=dtype).model
m.allocate(ctx + steps + 128)
m.prefill(list(range(100, 100 + ctx)))
def step(tok):
    lg = m.verify([tok], [-1]); m.commit([0]); return int(lg[0].argmax())
t = 5
for _ in range(10):
    t = step(t)
samples = []
for _ in range(steps):
    t0 = time.perf_counter(); t = step(t); samples.append(time.perf_counter() - t0)
out = {"decode_ms": statistics.median(samples) * 1e3}
def verify(parents):
    toks = [5 + i for i in range(len(parents))]
    m.verify(toks, parents)
    ts = []
    attn[0] = 0.0
    for _ in range(9):
        t0 = time.perf_counter(); m.verify(toks, parents); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3, attn[0] / 9 * 1e3
for n in (4, 6, 16):
    out[f"verify{n}_ms"], out[f"verify{n}_attn_ms"] = verify(list(range(-1, n - 1)))
out["tree46_ms"], out["tree46_attn_ms"] = verify([-1] + [p + 1 for p in plan_from_shape((3, 2, 2, 1, 1))])
out["packed"] = common.packs(m.compute_dtype)
out["native"] = native.status()
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--dtype", choices=("bf16", "fp32", "q8"), default="bf16")
    ap.add_argument("--last", type=int, default=0, help="run only the last N configurations (the engine's own is last)")
    a = ap.parse_args()
    # (label, packed, native, native linear, quant, C pass, pad rows, bf16 glue[, bf16 records])
    configs = [("plain weights, torch attention", "0", "0", "0", "0", "0", "2", "0"),
               ("packed weights, torch attention", "1", "0", "0", "0", "0", "2", "0"),
               ("packed weights, C attention", "1", "1", "0", "0", "0", "2", "0")]
    if a.dtype == "bf16":
        configs.append(("... small products padded as probed", "1", "1", "0", "0", "0", "", "0"))
        configs.append(("... and the C glue (glue_bf16.c)", "1", "1", "0", "0", "0", "", "1"))
        configs.append(("C pass, bf16 records (bf16_rows.c)", "1", "1", "1", "1", "1", "", "1", "1"))
    if a.dtype in ("fp32", "q8"):
        configs.append(("C linear (fp32), torch pass", "1", "1", "1", "0", "0", "2", "0"))
        configs.append(("C linear (GGUF blocks), torch pass", "1", "1", "1", "1", "0", "2", "0"))
        configs.append(("C pass (llama_rows.c), fp32 weights", "1", "1", "1", "0", "1", "2", "0"))
        configs.append(("C pass (llama_rows.c), GGUF blocks", "1", "1", "1", "1", "1", "2", "0"))
    if a.last:
        configs = configs[-a.last:]
    print(f"SmolLM2-135M {a.dtype}, context {a.context}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    for label, packed, nat, lin, quant, rows, pad, glue, *rec in configs:
        env = dict(os.environ, SPECCHAT_PACKED=packed, SPECCHAT_NATIVE=nat, SPECCHAT_NATIVE_LINEAR=lin, SPECCHAT_QUANT=quant,
                   SPECCHAT_NATIVE_ROWS=rows, SPECCHAT_PAD_ROWS=pad, SPECCHAT_NATIVE_GLUE=glue, SPECCHAT_NATIVE_BF16=(rec or ["0"])[0])
        r = subprocess.run([sys.executable, "-c", CHILD, str(a.context), str(a.steps), a.dtype], capture_output=True, text=True, env=env)
        if r.returncode:
            print(f"{label}: failed: {r.stderr.strip().splitlines()[-1:]}")
            continue
        d = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"{label:<36} packed={d['packed']} decode {d['decode_ms']:6.2f} ms ({1000 / d['decode_ms']:5.1f} tok/s) · verify 4 rows {d['verify4_ms']:6.2f}"
              f" · 6 rows {d['verify6_ms']:6.2f}"
              f" · 16 rows {d['verify16_ms']:6.2f} · tree 46 {d['tree46_ms']:6.2f} ms"
              + (f" (attention {d['tree46_attn_ms']:5.2f})" if d["tree46_attn_ms"] else " (attention inside C calls, not timed)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
