"""Session 29: pld:auto and hybrid:auto alternated on one prompt, 256 new tokens: tokens/s, tokens a
step and the three slowest draft steps (hybrid:auto's drafter, left out, re-measured after a long
catch-up):

    .venv/bin/python bench/results/2026-11-27-session29/scripts/hyb.py
"""
import os, sys, time, statistics as st
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, ".")
from engine.session import ChatSession
from engine.strategy import from_spec
from engine.generate import run_generation
s = ChatSession.load()
dec = s.decoder
p = "Write a Python function that returns the n-th Fibonacci number, with a short docstring and an example."
ids = s.encode_chat([{"role": "user", "content": p}])
for spec in ["pld:auto", "hybrid:auto", "pld:auto", "hybrid:auto"]:
    strat = from_spec(spec)
    dec.reset()
    evs, summ = run_generation(dec, ids, strat, 256)
    D = [e.draft_ms for e in evs[1:]]; V = [e.verify_ms for e in evs[1:]]
    big = sorted(D)[-3:]
    print(f"{spec}: {summ.tokens_per_s:.1f} tok/s, {summ.mean_accepted:.2f} tok/step, steps {len(D)}, draft mean {st.mean(D):.2f} max3 {[round(b,1) for b in big]}, verify mean {st.mean(V):.2f}")
