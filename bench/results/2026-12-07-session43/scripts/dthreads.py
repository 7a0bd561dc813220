"""draft_threads None (the C pass's pool) vs 1, alternated; usage: dthreads.py DRAFTER SPEC[,SPEC] ROUNDS"""
import json, sys, time
from pathlib import Path
REPO = Path(__file__).resolve().parents[4]; sys.path.insert(0, str(REPO))
from engine.session import ChatSession
from engine.strategy import from_spec
P = json.load(open(REPO / "assets/prompts/bench.json")); P = P if isinstance(P, list) else P["prompts"]
sess = ChatSession.load(dtype="bf16", strategy="ar", drafter=sys.argv[1])
dec = sess.decoder
ids_of = [sess.encode_chat([{"role": "user", "content": p.get("prompt") or p.get("text")}]) for p in P]
for ids in ids_of[:1]:
    dec.reset(); dec.start(ids)
    for ev in dec.steps(from_spec("ar"), 16): pass
for r in range(int(sys.argv[3])):
    for spec in ["ar"] + sys.argv[2].split(","):
        for dt in ((None,) if spec == "ar" else (None, 1)):
            dec.draft_threads = dt
            wall = dr = 0.0; n = steps = 0
            for ids in ids_of:
                dec.reset(); dec.start(ids)
                t = time.perf_counter()
                for ev in dec.steps(from_spec(spec), 128):
                    dr += ev.draft_ms; n += len(ev.emitted); steps += 1
                wall += time.perf_counter() - t
            print(f"r{r} {spec:12s} draft_threads={dt}  {n} tok {n/steps:.3f}/step  draft {dr/steps:.3f} ms/step  {wall*1000/steps:.3f} ms/step  {n/wall:.1f} tok/s", flush=True)
