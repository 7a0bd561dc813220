import json, sys, collections
from pathlib import Path
REPO = Path("/work/main"); sys.path.insert(0, str(REPO))
import engine  # noqa
from engine.generate import run_generation
from engine.session import ChatSession
from engine.strategy import from_spec
dtype, specs, nprompt = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
P = json.load(open(REPO / "assets/prompts/bench.json")); P = P if isinstance(P, list) else P["prompts"]
sess = ChatSession.load(drafter=str(REPO / "assets/mamba-byte-drafter"), dtype=dtype, strategy="ar")
dec = sess.decoder
for spec in specs:
    hist = collections.Counter(); n = steps = 0; dms = vms = 0.0
    for p in P[:nprompt]:
        ids = sess.encode_chat([{"role": "user", "content": p.get("prompt") or p.get("text")}])
        dec.reset(); evs, _ = run_generation(dec, ids, from_spec(spec), 128)
        for e in evs:
            if e.finished and not e.emitted: continue
            hist[(e.drafted, e.accepted)] += 1; n += len(e.emitted); steps += 1; dms += e.draft_ms; vms += e.verify_ms
    print(spec, "tok/step %.3f draft %.2f verify %.2f" % (n / steps, dms / steps, vms / steps))
    by = collections.defaultdict(collections.Counter)
    for (d, a), c in hist.items(): by[d][a] += c
    for d in sorted(by):
        tot = sum(by[d].values()); print("  drafted", d, "steps", tot, "accepted dist", dict(sorted(by[d].items())))
