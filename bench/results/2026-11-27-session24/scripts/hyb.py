import sys; sys.path.insert(0, "/work/main"); import engine
import json, time, collections
from engine.session import ChatSession
from engine.strategy import from_spec
from engine.generate import run_generation
dtype = sys.argv[1]; which = sys.argv[2].split(",")
prompts = {p["name"] if "name" in p else p.get("id"): p for p in json.load(open("/work/main/assets/prompts/bench.json"))} if False else None
P = json.load(open("/work/main/assets/prompts/bench.json"))
sess = ChatSession.load(drafter="/work/main/assets/mamba-drafter-smollm2", dtype=dtype, strategy="ar")
dec = sess.decoder
for p in (P if isinstance(P, list) else P["prompts"]):
    name = p.get("name") or p.get("id")
    if name not in which: continue
    ids = sess.encode_chat([{"role": "user", "content": p.get("prompt") or p.get("text")}])
    for spec in sys.argv[3].split(","):
        s = from_spec(spec)
        dec.reset()
        evs, summ = run_generation(dec, ids, s, 128)
        n = sum(len(e.emitted) for e in evs); steps = len(evs)
        ms = sum(e.ms for e in evs)
        used = collections.Counter(str((e.policy or {}).get("drafter")) for e in evs)
        nodes = sum(len(e.tree_tokens) for e in evs) / steps
        print(f"{name:10s} {spec:12s} tok/step {n/steps:.2f}  ms/step {ms/steps:.2f}  nodes/step {nodes:.1f} drafter_used {dict(used)}  tok/s {n/ms*1000:.1f}")
