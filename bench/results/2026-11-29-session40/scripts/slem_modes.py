import json, sys, collections
from pathlib import Path
REPO = Path("/work/main"); sys.path.insert(0, str(REPO))
import engine  # noqa
from engine.generate import run_generation
from engine.session import ChatSession
from engine.strategy import from_spec
from engine.drafters.vocab import BridgeDrafter
dtype, configs, nprompt = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
P = json.load(open(REPO / "assets/prompts/bench.json")); P = P if isinstance(P, list) else P["prompts"]
sess = ChatSession.load(drafter=str(REPO / "assets/mamba-byte-drafter"), dtype=dtype, strategy="ar")
dec = sess.decoder
ref = {}
tot = {c: [0, 0, 0.0, 0.0, 0.0, 0] for c in configs}
for p in P[:nprompt]:
    ids = sess.encode_chat([{"role": "user", "content": p.get("prompt") or p.get("text")}])
    for c in configs:
        spec, mode = c.split("/") if "/" in c else (c, "none")
        BridgeDrafter.draft_cut = mode
        dec.reset(); evs, _ = run_generation(dec, ids, from_spec(spec), 128)
        toks = [t for e in evs for t in e.emitted]
        if spec == "ar": ref[p["name"] if "name" in p else id(p)] = toks
        else:
            r = ref.get(p["name"] if "name" in p else id(p))
            if r is not None and r != toks: print("MISMATCH", c)
        st = [e for e in evs if e.emitted]
        t = tot[c]; t[0] += len(toks); t[1] += len(st); t[2] += sum(e.draft_ms for e in st); t[3] += sum(e.verify_ms for e in st); t[4] += sum(e.ms for e in st); t[5] += sum(e.drafted for e in st)
for c, (n, s, d, v, ms, dr) in tot.items():
    print(f"{c:20s} tok/step {n/s:.3f} drafted/step {dr/s:.2f} draft {d/s:.2f} verify {v/s:.2f} ms step {ms/s:.2f} tok/s {n/ms*1000:.1f}")
