"""tok/s of the decode loop (prefill excluded) and tokens a step over the 12 bench prompts x 128, bf16,
T=0.7 top-p 0.9 seeds 1..12 (GREEDY=1: greedy; DT=auto|q8: another compute type), for each spec given; the engine
from the tree this file is run against (PYTHONPATH)."""
import sys, time, json
from engine.session import ChatSession
from engine.bench import load_prompts
from engine.generate import run_generation
from engine.strategy import from_spec
S = ChatSession.load(drafter=sys.argv[1], dtype=__import__("os").environ.get("DT", "bf16"))
dec = S.decoder
prompts = [S.encode_chat([{"role": "user", "content": p["text"]}]) for p in load_prompts(None)]
out = {}
for spec in sys.argv[2].split(","):
    s = from_spec(spec).replace(**({} if __import__("os").environ.get("GREEDY") else dict(temperature=0.7, seed=1, top_p=0.9)))
    gate = None
    for rep in range(2):  # the first pass warms up (and trains the gate, as bench's warm-up does)
        n = steps = 0; dt = 0.0
        for i, ids in enumerate(prompts):
            dec.reset(); dec.gate = gate.carried() if gate is not None else None
            if dec.verify_cost is None: dec.calibrate()
            t0 = time.perf_counter()
            evs, summ = run_generation(dec, ids, s.replace(seed=1 + i), 128)
            dt += time.perf_counter() - t0 - summ.prefill_s
            gate = dec.gate
            n += sum(len(e.emitted) for e in evs); steps += sum(1 for e in evs if e.emitted)
    out[spec] = (n / dt, n / steps)
print(json.dumps(out))
