import cProfile, pstats, json, sys, time
from engine.session import ChatSession
from engine.strategy import from_spec
from engine.generate import run_generation
session = ChatSession.load(dtype="bf16")
prompts = json.load(open("assets/prompts/bench.json"))
prompts = prompts["prompts"] if isinstance(prompts, dict) else prompts
enc = [session.encode_chat([{"role": "user", "content": p["text"]}]) for p in prompts]
dec = session.decoder
s = from_spec(sys.argv[1])
dec.calibrate()
for ids in enc[:2]:
    dec.reset(); run_generation(dec, ids, s, 32)
pr = cProfile.Profile()
pr.enable()
for ids in enc:
    dec.reset(); run_generation(dec, ids, s, 128)
pr.disable()
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(25)
