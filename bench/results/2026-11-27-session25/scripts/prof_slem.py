import cProfile, pstats, time
from engine.session import ChatSession
from engine.strategy import from_spec, preset
from engine.generate import run_generation
s = ChatSession.load(target=None, drafter="assets/mamba-byte-drafter")
ids = s.encode_chat([{"role": "user", "content": "Explain how a rainbow forms, in simple terms a ten-year-old would understand."}])
st = from_spec("sd:8@slem", preset("sd"))
dec = s.decoder
for strat in (preset("ar"), st, preset("ar"), st):
    dec.reset()
    t0 = time.perf_counter(); ev, summ = run_generation(dec, ids, strat, 128); dt = time.perf_counter() - t0
    print(strat.name, strat.vocab, summ.new_tokens, f"{dt*1000:.0f} ms", f"{summ.steps} steps", f"{dt*1000/summ.steps:.2f} ms/step")
dec.reset()
pr = cProfile.Profile(); pr.enable(); run_generation(dec, ids, st, 128); pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)
