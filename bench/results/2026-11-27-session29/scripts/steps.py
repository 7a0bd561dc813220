"""Session 29: per-step draft and verify milliseconds (the StepEvents' own timers) and tokens/s of
strategies on three prompts, 128 new tokens, bf16, after a 16-token warm-up:

    .venv/bin/python bench/results/2026-11-27-session29/scripts/steps.py ar,sd:5,pld:auto,hybrid:auto
"""
import os, sys, time, statistics as st
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, ".")
from engine.session import ChatSession
from engine.strategy import from_spec
from engine.generate import run_generation
s = ChatSession.load(dtype="bf16")
dec = s.decoder
prompts = ["Write a short story about a robot who learns to paint.", "Write a Python function that checks whether a string is a palindrome.", "Explain how vaccines train the immune system."]
for spec in sys.argv[1].split(","):
    strat = from_spec(spec)
    run_generation(dec, s.encode_chat([{"role": "user", "content": prompts[0]}]), strat, 16)
    D, V, W, N, T = [], [], [], 0, 0
    for p in prompts:
        dec.reset()
        ids = s.encode_chat([{"role": "user", "content": p}])
        evs, summ = run_generation(dec, ids, strat, 128)
        for e in evs[1:]:
            D.append(e.draft_ms); V.append(e.verify_ms)
        N += summ.new_tokens; T += summ.decode_s
    print(f"{spec}: {N/T:.1f} tok/s, steps {len(D)}, draft ms med {st.median(D):.2f} mean {st.mean(D):.2f}; verify med {st.median(V):.2f} mean {st.mean(V):.2f}; wall/step {1e3*T/len(D):.2f}")
