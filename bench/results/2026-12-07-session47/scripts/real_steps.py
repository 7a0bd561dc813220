"""pld:auto on the 12 bench prompts, bf16: per step nodes drafted, accepted; and the oracle sim on the same replies."""
import json, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4])); sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from engine.session import ChatSession
from engine.bench import load_prompts
from engine.generate import run_generation
from engine.strategy import from_spec
spec = sys.argv[1] if len(sys.argv) > 1 else "pld:auto"
S = ChatSession.load(drafter="none", dtype="bf16")
dec = S.decoder
prompts = load_prompts(None)
s = from_spec(spec)
out = []
gate = None
for rep in range(2):
    tot_t = tot_s = 0; nodes = []; acc = []
    for p in prompts:
        ids = S.encode_chat([{"role": "user", "content": p["text"]}])
        dec.reset(); dec.gate = gate.carried() if gate is not None else None
        if dec.verify_cost is None: dec.calibrate()
        evs, summ = run_generation(dec, ids, s, 128)
        gate = dec.gate
        st = [e for e in evs if e.emitted]
        nodes += [e.drafted for e in st]; acc += [e.accepted for e in st]
        if rep == 1: out.append({"prompt_ids": ids, "response_ids": [t for e in evs for t in e.emitted]})
    print(f"pass {rep}: steps {len(nodes)} tokens {sum(acc)+len(acc)} tok/step {(sum(acc)+len(acc))/len(acc):.3f} mean nodes {sum(nodes)/len(nodes):.2f}")
import collections
print(sorted(collections.Counter(nodes).items()))
json.dump(out, open(str(__import__("pathlib").Path(__file__).resolve().parent / "bf16_replies.json"), "w"))
