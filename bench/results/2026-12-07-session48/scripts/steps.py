"""Per-step time of a strategy on the bench prompts: wall per step vs draft_ms + verify_ms, verify rows."""
import sys, time, argparse, statistics
from engine import native
import torch
from engine.cli import build_parser, load_session, strategy_from_args
from engine.bench import load_prompts
from engine.generate import run_generation
spec = sys.argv[1]; dt = sys.argv[2] if len(sys.argv) > 2 else "bf16"
args = build_parser().parse_args(["bench", "--dtype", dt, "--strategies", spec])
session = load_session(args)
from engine.strategy import from_spec
s = from_spec(spec)
dec = session.decoder
prompts = load_prompts(None)
enc = [session.encode_chat([{"role": "user", "content": p["text"]}]) for p in prompts]
gate = None
def run(ids, n):
    global gate
    dec.reset(); dec.gate = gate.carried() if gate is not None else None
    if (s.name in ("mab", "optimal") or s.adaptive) and dec.verify_cost is None: dec.calibrate()
    t0 = time.perf_counter(); evs, summ = run_generation(dec, ids, s, n); T = time.perf_counter() - t0 - summ.prefill_s
    gate = dec.gate
    return evs, summ, T
run(enc[0], 16)
tot = dict(T=0, draft=0, verify=0, ms=0, steps=0, nodes=0, acc=0, tokens=0)
for ids in enc:
    evs, summ, T = run(ids, 128)
    steps = [e for e in evs if e.drafted or e.verify_ms]
    tot["T"] += T; tot["steps"] += len(steps); tot["tokens"] += summ.new_tokens
    tot["draft"] += sum(e.draft_ms for e in steps); tot["verify"] += sum(e.verify_ms for e in steps)
    tot["ms"] += sum(e.ms for e in steps); tot["nodes"] += sum(e.drafted for e in steps)
n = tot["steps"]
print(f"{spec} {dt}: {tot['tokens']/tot['T']:.1f} tok/s, {tot['tokens']/n:.2f} tok/step, {tot['nodes']/n:.2f} nodes/step; "
      f"per step ms: wall {tot['T']*1e3/n:.3f}, e.ms {tot['ms']/n:.3f}, draft {tot['draft']/n:.3f}, verify {tot['verify']/n:.3f}, "
      f"other {tot['T']*1e3/n - tot['draft']/n - tot['verify']/n:.3f}")
