"""Session 37: where a greedy chain's drafting time goes (ModelDrafter._sync / _step_fast / _fork /
propose, ms a step), the first prompt of assets/prompts/bench.json, bf16, 128 new tokens, twice.

    .venv/bin/python bench/results/2026-11-29-session37/scripts/draft_prof.py sd:5,hybrid:5
"""
import sys, time, json, collections
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
import engine
from engine.session import ChatSession
from engine.strategy import from_spec
from engine.generate import run_generation
import engine.drafters.model as dm
T = collections.defaultdict(lambda: [0, 0.0])
def wrap(cls, name):
    f = getattr(cls, name)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); T[name][0] += 1; T[name][1] += time.perf_counter() - t0; return r
    setattr(cls, name, g)
wrap(dm.ModelDrafter, "_sync"); wrap(dm.ModelDrafter, "_step_fast"); wrap(dm.ModelDrafter, "_fork"); wrap(dm.ModelDrafter, "propose"); wrap(dm.ModelDrafter, "_top")
sess = ChatSession.load(drafter=str(__import__("pathlib").Path(__file__).resolve().parents[4]) + "/assets/mamba-drafter-smollm2", dtype="bf16", strategy="ar")
dec = sess.decoder
P = json.load(open(str(__import__("pathlib").Path(__file__).resolve().parents[4]) + "/assets/prompts/bench.json")); P = P if isinstance(P, list) else P["prompts"]
ids = sess.encode_chat([{"role": "user", "content": P[0].get("prompt") or P[0].get("text")}])
for spec in sys.argv[1].split(","):
    for rep in range(2):
        T.clear(); dec.reset()
        evs, s = run_generation(dec, ids, from_spec(spec), 128)
        steps = len(evs)
        print(spec, rep, "steps", steps, {k: (v[0], round(v[1] * 1000 / steps, 2)) for k, v in T.items()}, "draft/step", round(sum(e.draft_ms for e in evs) / steps, 2))
