import json, sys, time
from pathlib import Path
REPO = Path("/work/main"); sys.path.insert(0, str(REPO))
from engine.session import ChatSession
from engine.strategy import from_spec
P = json.load(open(REPO / "assets/prompts/bench.json")); P = P if isinstance(P, list) else P["prompts"]
sess = ChatSession.load(dtype=sys.argv[1], strategy="ar")
dec = sess.decoder
specs = sys.argv[2].split(",")
for spec in specs:
    wall = ms = 0.0; n = 0
    for p in P[:int(sys.argv[3])]:
        ids = sess.encode_chat([{"role": "user", "content": p.get("prompt") or p.get("text")}])
        dec.reset(); dec.start(ids)
        t = time.perf_counter()
        for ev in dec.steps(from_spec(spec), 128):
            ms += ev.ms; n += len(ev.emitted)
        wall += time.perf_counter() - t
    print(f"{spec:12s} tokens {n} sum(ev.ms) {ms/1000:.2f}s wall {wall:.2f}s  outside {100*(wall-ms/1000)/wall:.1f}%  tok/s(ms) {n/ms*1000:.1f} tok/s(wall) {n/wall:.1f}")
