import os, sys, cProfile, pstats
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from engine.session import ChatSession
from engine.bench import load_prompts
from engine.generate import run_generation
from engine.strategy import from_spec
S = ChatSession.load(drafter=(sys.argv[3] if len(sys.argv) > 3 else "none"), dtype=os.environ.get("DT", "bf16"))
dec = S.decoder
prompts = [S.encode_chat([{"role": "user", "content": p["text"]}]) for p in load_prompts(None)]
spec = sys.argv[1]; kw = dict(temperature=0.7, seed=1, top_p=0.9) if sys.argv[2] == "sample" else {}
s = from_spec(spec).replace(**kw)
def run():
    gate = None
    for ids in prompts:
        dec.reset(); dec.gate = gate.carried() if gate is not None else None
        if dec.verify_cost is None: dec.calibrate()
        run_generation(dec, ids, s, 128); gate = dec.gate
run()
pr = cProfile.Profile(); pr.enable(); run(); pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)
