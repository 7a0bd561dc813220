"""A/B: the sampling cuts' largest values through torch.topk (A) or the C kernel (B), same seeds:
tokens must match; tok/s of the decode loop over the 12 bench prompts x 128 tokens, bf16."""
import json, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import torch
from engine import sampling
from engine.session import ChatSession
from engine.bench import load_prompts
from engine.generate import run_generation
from engine.strategy import from_spec
C = sampling.top_values
T = lambda x, m: x.topk(m, dim=-1).values
S = ChatSession.load(drafter="none", dtype="bf16")
dec = S.decoder
prompts = [S.encode_chat([{"role": "user", "content": p["text"]}]) for p in load_prompts(None)]
cuts = {"top-p 0.9": dict(top_p=0.9), "top-k 40": dict(top_k=40)}
res = {}
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
    for cut, kw in cuts.items():
        for spec in ("ar", "pld:auto"):
            outs = {}
            for name, f in (("torch", T), ("C", C)) if rnd % 2 == 0 else (("C", C), ("torch", T)):
                sampling.top_values = f
                s = from_spec(spec).replace(temperature=0.7, seed=1, **kw)
                toks, dt, gate = [], 0.0, None
                for ids in prompts:
                    dec.reset(); dec.gate = gate.carried() if gate is not None else None
                    if dec.verify_cost is None: dec.calibrate()
                    t0 = time.perf_counter()
                    evs, summ = run_generation(dec, ids, s, 128)
                    dt += time.perf_counter() - t0 - summ.prefill_s
                    gate = dec.gate
                    toks.append([t for e in evs for t in e.emitted])
                outs[name] = toks
                n = sum(map(len, toks))
                res.setdefault((cut, spec, name), []).append(n / dt)
                print(f"round {rnd} {cut:9} {spec:8} {name:5} {n} tokens {n / dt:7.1f} tok/s", flush=True)
            print("  same tokens:", outs["torch"] == outs["C"], flush=True)
for k, v in res.items():
    print(k, " ".join(f"{x:.1f}" for x in v))
