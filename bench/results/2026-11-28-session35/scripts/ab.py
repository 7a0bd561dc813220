"""The 12 evaluation prompts x 128 tokens through one ChatSession (bf16), the C draft step
(Mamba2.draft_step_fast) on and off in turn after a warm-up pass: draft / verify / step ms a step,
tokens a step and tok/s.

    .venv/bin/python bench/results/2026-11-28-session35/scripts/ab.py sd:8@slem assets/mamba-byte-drafter 2
"""
import json, sys, threading
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from pathlib import Path
from engine.session import ChatSession
from engine.models import mamba2
strategy = sys.argv[1]; drafter = sys.argv[2]; reps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
s = ChatSession.load(drafter=drafter, strategy=strategy, dtype="bf16")
prompts = json.loads((Path(__file__).resolve().parents[4] / "assets/prompts/bench.json").read_text())
real = mamba2.Mamba2.draft_step_fast
off = lambda self, *a, **k: None
def run():
    D=V=T=0.0; n=0; tok=0; dr=0
    for p in prompts:
        s.decoder.reset()
        for ev in s.stream_chat([{"role": "user", "content": p["text"]}], 128, threading.Event()):
            D+=ev.draft_ms; V+=ev.verify_ms; T+=ev.ms; n+=1; tok+=len(ev.emitted); dr+=ev.drafted
    return D/n, V/n, T/n, tok, tok/n, tok/T*1000
run()  # warm-up
for rep in range(reps):
    for mode in ("c", "torch"):
        mamba2.Mamba2.draft_step_fast = real if mode == "c" else off
        d, v, t, tok, tps, rate = run()
        print(f"{strategy} {mode:5s} draft {d:.2f} verify {v:.2f} step {t:.2f} ms  tok {tok} tok/step {tps:.3f}  {rate:.1f} tok/s", flush=True)
