"""Session 38: certified greedy argmax on/off alternated in one process (forced on: probe skipped),
ar and pld:auto over the 12 bench prompts x 128, bf16; ms a step."""
import sys, time, json
sys.path.insert(0, '/work/main')
from engine.session import ChatSession
from engine.strategy import from_spec
from engine.generate import run_generation
from engine.models.certified import CertifiedHead
sess = ChatSession.load(drafter="assets/mamba-drafter-smollm2", dtype="bf16", strategy="ar")
dec = sess.decoder; tgt = dec.target
ch = CertifiedHead(tgt.lm_head_t, probe=False)
print("probe says max_rows", CertifiedHead(tgt.lm_head_t).max_rows, flush=True)
P = json.load(open("/work/main/assets/prompts/bench.json"))
ids = [sess.encode_chat([{"role": "user", "content": p["text"]}]) for p in P]
specs = sys.argv[1].split(",")
for spec in specs:
    dec.reset(); run_generation(dec, ids[0], from_spec(spec), 16)
res = {}
for rep in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2):
    for on in (False, True):
        tgt.__dict__["_certified"] = ch if on else None
        for spec in specs:
            n = st = 0; ms = vms = 0.0; toks = []
            for i in ids:
                dec.reset(); dec.gate = None
                evs, _ = run_generation(dec, i, from_spec(spec), 128)
                evs = [e for e in evs if not e.finished]
                n += sum(len(e.emitted) for e in evs); st += len(evs); ms += sum(e.ms for e in evs); vms += sum(e.verify_ms for e in evs)
                toks.append([t for e in evs for t in e.emitted])
            key = (spec, on)
            if spec + "ref" not in res: res[spec + "ref"] = toks
            assert toks == res[spec + "ref"] or spec != "ar", "tokens differ"
            print(f"rep {rep} cert {int(on)} {spec:10s} tok/step {n/st:.3f} verify {vms/st:6.2f} step {ms/st:6.2f} ms tok/s {n/ms*1000:6.1f}", flush=True)
