import sys, time, json, collections
sys.path.insert(0, '.')
from engine.session import ChatSession
from engine.strategy import from_spec
from engine.generate import run_generation
import engine.models.base as mb
T = collections.defaultdict(lambda: [0, 0.0])
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); T[key][0] += 1; T[key][1] += time.perf_counter() - t0; return r
    setattr(obj, name, g)
sess = ChatSession.load(drafter="assets/mamba-drafter-smollm2", dtype="bf16", strategy="ar")
dec = sess.decoder
tgt = dec.target
wrap(tgt, "forward_rows", "body"); wrap(tgt, "logits", "head"); wrap(tgt, "commit", "commit"); wrap(tgt, "verify", "verify")
P = json.load(open("assets/prompts/bench.json")); P = P if isinstance(P, list) else P["prompts"]
ids = [sess.encode_chat([{"role": "user", "content": p.get("prompt") or p.get("text")}]) for p in P]
for spec in sys.argv[1].split(","):
    dec.reset(); run_generation(dec, ids[0], from_spec(spec), 16)
    T.clear(); steps = 0; vms = 0
    for i in ids[:6]:
        dec.reset(); evs, s = run_generation(dec, i, from_spec(spec), 128)
        evs = [e for e in evs if not e.finished]; steps += len(evs); vms += sum(e.verify_ms for e in evs)
    print(spec, "steps", steps, "verify_ms/step", round(vms / steps, 2), {k: (v[0], round(v[1] * 1000 / steps, 2)) for k, v in T.items()})
