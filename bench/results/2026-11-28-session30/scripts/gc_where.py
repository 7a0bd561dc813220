"""Session 30: where full garbage collections fall in bench/app_stream.py (during an app reply or not).
    .venv/bin/python bench/results/2026-11-28-session30/scripts/gc_where.py [--no-gc-hold]
"""
import gc, sys, time, runpy
sys.argv = ["app_stream.py", "--strategy", "pld:auto", "--prompts", "6", "--one-chat"] + sys.argv[1:]
from app.screens.chat import ChatScreen
streaming = [False]
_start, _fin = ChatScreen._start_reply, ChatScreen._finish
async def start(self):
    streaming[0] = True
    await _start(self)
async def fin(self, run):
    streaming[0] = False
    await _fin(self, run)
ChatScreen._start_reply, ChatScreen._finish = start, fin
log = []
t0 = [0.0]
def cb(phase, info):
    if info["generation"] != 2: return
    if phase == "start": t0[0] = time.perf_counter(); return
    log.append((streaming[0], 1e3 * (time.perf_counter() - t0[0])))
gc.callbacks.append(cb)
try:
    runpy.run_path("bench/app_stream.py", run_name="__main__")
except SystemExit:
    pass
print("full collections (during a reply?, ms):", [(h, round(ms, 1)) for h, ms in log])
