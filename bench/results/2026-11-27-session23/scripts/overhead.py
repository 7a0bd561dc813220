"""Run from the repository root: python bench/results/2026-11-27-session23/scripts/overhead.py STRATEGY DTYPE.
pld:auto / ar in bf16: the share of a step spent inside the target's passes vs the rest."""
import json, sys, threading, time
from pathlib import Path
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from engine.session import ChatSession
strategy = sys.argv[1] if len(sys.argv) > 1 else "pld:auto"
s = ChatSession.load(drafter="assets/mamba-drafter-smollm2", strategy=strategy, dtype=sys.argv[2] if len(sys.argv) > 2 else "bf16")
m = s.decoder.target
acc = {"verify": 0.0, "n": 0, "rows": 0}
orig = m.verify
def timed(tokens, parents, *a, **k):
    t0 = time.perf_counter(); r = orig(tokens, parents, *a, **k); acc["verify"] += time.perf_counter() - t0; acc["n"] += 1; acc["rows"] += len(tokens); return r
m.verify = timed
prompts = json.loads((Path(__file__).resolve().parents[4] / "assets/prompts/bench.json").read_text())
for rep in range(2):
    acc.update(verify=0.0, n=0, rows=0)
    tot, steps, toks = 0.0, 0, 0
    for p in prompts:
        s.decoder.reset()
        t_prev = None
        for ev in s.stream_chat([{"role": "user", "content": p["text"]}], 128, threading.Event()):
            now = time.perf_counter()
            if t_prev is not None:
                tot += now - t_prev; steps += 1; toks += len(ev.emitted)
            t_prev = now
    print(f"{strategy} rep {rep}: {steps} steps, {toks/steps:.2f} tok/step, {tot/steps*1e3:.2f} ms/step, "
          f"verify {acc['verify']/acc['n']*1e3:.2f} ms/call ({acc['rows']/acc['n']:.1f} rows), "
          f"outside verify {(tot - acc['verify'])/steps*1e3:.2f} ms/step")
