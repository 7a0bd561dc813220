"""Session 30: stream_chat's decode rate alone, beside a busy process (CPU only) and beside a busy Python
thread (CPU + GIL), at the GIL switch interval SWITCH (s, default 0.0005); DUTY (0.3) of every 0.25 s busy.
    SWITCH=0.0001 .venv/bin/python bench/results/2026-11-28-session30/scripts/gil_burn.py pld:auto [DTYPE]
"""
import os, sys, time, threading, json, multiprocessing as mp
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, ".")  # run from the repository root
from engine.session import ChatSession
from engine.strategy import from_spec

DUTY = float(os.environ.get("DUTY", "0.3"))
PERIOD = 0.25

def burn(stop, duty=DUTY):
    while not stop.is_set():
        t0 = time.perf_counter()
        x = 0
        while time.perf_counter() - t0 < duty * PERIOD:
            x += 1
        time.sleep((1 - duty) * PERIOD)

def proc_burn(ev):
    burn(ev)

def run(session, prompts, max_new):
    toks, secs = 0, 0.0
    for p in prompts:
        t0 = None; n = 0
        for ev in session.stream_chat([{"role": "user", "content": p}], max_new, threading.Event()):
            if t0 is None: t0 = time.perf_counter(); continue
            n += len(ev.emitted)
        secs += time.perf_counter() - t0; toks += n
    return toks / secs

def main():
    strat = sys.argv[1]; dtype = sys.argv[2] if len(sys.argv) > 2 else "auto"
    prompts = [p["text"] for p in json.load(open("assets/prompts/bench.json"))][:6]
    s = ChatSession.load(strategy=from_spec(strat), dtype=dtype)
    sys.setswitchinterval(float(os.environ.get("SWITCH", "0.0005")))
    run(s, prompts[:1], 64)
    for rep in range(2):
        r0 = run(s, prompts, 128)
        ev = mp.Event(); pr = mp.Process(target=proc_burn, args=(ev,)); pr.start(); time.sleep(0.2)
        r1 = run(s, prompts, 128); ev.set(); pr.join()
        st = threading.Event(); th = threading.Thread(target=burn, args=(st,)); th.start()
        r2 = run(s, prompts, 128); st.set(); th.join()
        print(f"{strat} {dtype} duty {DUTY}: none {r0:.1f}  busy process {r1:.1f} ({r1/r0:.2f})  busy py thread {r2:.1f} ({r2/r0:.2f})", flush=True)

main()
