"""Per prompt and strategy: tokens a step and the step's milliseconds split into drafting and
verifying (StepEvent.draft_ms / verify_ms), greedy, 128 new tokens, the shipped pair.

    .venv/bin/python bench/results/2026-11-29-session37/scripts/split.py DTYPE PROMPTS|all SPEC,SPEC,...
"""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
import engine  # noqa: E402,F401
from engine.generate import run_generation  # noqa: E402
from engine.session import ChatSession  # noqa: E402
from engine.strategy import from_spec  # noqa: E402

dtype, which, specs = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
P = json.load(open(REPO / "assets/prompts/bench.json"))
P = P if isinstance(P, list) else P["prompts"]
sess = ChatSession.load(drafter=str(REPO / "assets/mamba-drafter-smollm2"), dtype=dtype, strategy="ar")
dec = sess.decoder
tot = {s: [0, 0, 0.0, 0.0, 0.0] for s in specs}
gates = {}
warm = sess.encode_chat([{"role": "user", "content": "Say hello."}])
for spec in specs:  # warm-up, excluded: first calls, allocator, the C libraries
    dec.reset()
    run_generation(dec, warm, from_spec(spec), 16)
for p in P:
    name = p.get("name") or p.get("id")
    if which != "all" and name not in which.split(","):
        continue
    ids = sess.encode_chat([{"role": "user", "content": p.get("prompt") or p.get("text")}])
    for spec in specs:
        s = from_spec(spec)
        dec.reset()
        dec.gate = gates[spec].carried() if gates.get(spec) is not None else None
        evs, summ = run_generation(dec, ids, s, 128)
        gates[spec] = dec.gate
        evs = [e for e in evs if not e.finished]
        n = sum(len(e.emitted) for e in evs)
        steps = len(evs)
        d = sum(e.draft_ms for e in evs)
        v = sum(e.verify_ms for e in evs)
        ms = sum(e.ms for e in evs)
        t = tot[spec]
        t[0] += n; t[1] += steps; t[2] += d; t[3] += v; t[4] += ms
        print(f"{name:10s} {spec:12s} tok/step {n / steps:.2f}  draft {d / steps:5.2f}  verify {v / steps:5.2f}  step {ms / steps:5.2f} ms  tok/s {n / ms * 1000:6.1f}", flush=True)
for spec, (n, steps, d, v, ms) in tot.items():
    print(f"ALL        {spec:12s} tok/step {n / steps:.2f}  draft {d / steps:5.2f}  verify {v / steps:5.2f}  step {ms / steps:5.2f} ms  tok/s {n / ms * 1000:6.1f}")
