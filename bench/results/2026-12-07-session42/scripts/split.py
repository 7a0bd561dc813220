"""Where a step's time goes, per strategy: drafting (ev.draft_ms), the verify pass with its
acceptance and commit (ev.verify_ms), the rest of the step inside the loop (ev.ms minus both:
booking, gate), and outside the step (wall minus ev.ms: the event, detokenising, the generator).
usage: python split.py DTYPE STRATEGIES N_PROMPTS [ROUNDS]   (session 42: bf16 ar,pld:auto 12 2)"""
import json, sys, time
from pathlib import Path
REPO = Path(__file__).resolve().parents[4]; sys.path.insert(0, str(REPO))
from engine.session import ChatSession
from engine.strategy import from_spec
P = json.load(open(REPO / "assets/prompts/bench.json")); P = P if isinstance(P, list) else P["prompts"]
sess = ChatSession.load(dtype=sys.argv[1], strategy="ar")
dec = sess.decoder
specs, n_prompts, rounds = sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 1
ids_of = [sess.encode_chat([{"role": "user", "content": p.get("prompt") or p.get("text")}]) for p in P[:n_prompts]]
for r in range(rounds):
    for spec in specs:
        wall = ms = dr = vf = 0.0; n = steps = rows = 0
        for ids in ids_of:
            dec.reset(); dec.start(ids)
            t = time.perf_counter()
            for ev in dec.steps(from_spec(spec), 128):
                ms += ev.ms; dr += ev.draft_ms; vf += ev.verify_ms; n += len(ev.emitted); steps += 1; rows += ev.drafted + 1
            wall += time.perf_counter() - t
        wall *= 1000.0
        print(f"r{r} {spec:12s} {n} tokens {steps} steps ({n / steps:.2f}/step, {rows / steps:.1f} rows)  per step ms: "
              f"draft {dr / steps:.3f} verify {vf / steps:.3f} rest {(ms - dr - vf) / steps:.3f} outside {(wall - ms) / steps:.3f} "
              f"= {wall / steps:.3f}  tok/s {n / wall * 1000:.1f}", flush=True)
