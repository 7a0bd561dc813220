"""Two n-gram datastores alternated in one session (bf16): the 12 evaluation prompts x 128 tokens
under each strategy given, reps rounds, after a warm-up pass; tokens a step and tok/s (decode
steps only), and whether every reply equals the session's plain greedy `ar` reply.

    .venv/bin/python bench/results/2026-11-28-session36/scripts/ab_ds.py OLD.npz NEW.npz pld:auto,hybrid:auto 3
"""
import json, sys, threading
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from pathlib import Path
from engine.session import ChatSession
from engine.strategy import from_spec

old, new, strategies, reps = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4]) if len(sys.argv) > 4 else 2
s = ChatSession.load(strategy="ar", dtype="bf16", datastore=old)
prompts = json.loads((Path(__file__).resolve().parents[4] / "assets/prompts/bench.json").read_text())


def run(strategy):
    s.strategy = from_spec(strategy)
    T = 0.0; n = 0; tok = 0; outs = []
    for p in prompts:
        s.decoder.reset()
        ids = []
        for ev in s.stream_chat([{"role": "user", "content": p["text"]}], 128, threading.Event()):
            T += ev.ms; n += 1; tok += len(ev.emitted); ids += ev.emitted
        outs.append(ids)
    return tok / n, tok / T * 1000, outs


ref = run("ar")
print(f"ar {ref[1]:.1f} tok/s", flush=True)
for st in strategies:
    s.attach_datastore(old); run(st)  # warm-up
for rep in range(reps):
    for label, path in (("old", old), ("new", new)) if rep % 2 == 0 else (("new", new), ("old", old)):
        s.attach_datastore(path)
        for st in strategies:
            tps, rate, outs = run(st)
            print(f"{rep} {label} {st:12s} tok/step {tps:.3f} {rate:.1f} tok/s  identical {outs == ref[2]}", flush=True)
