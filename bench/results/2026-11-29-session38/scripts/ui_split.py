"""Session 38: the UI thread's CPU while the app streams, split by what the frame does:
ChatScreen._drain (events in, Markdown write, status), Dashboard._paint, Screen._refresh_layout
and Screen._compositor_refresh (layout and render), measured with time.thread_time().
(Before fb2e78f a BATCH=1 switch here monkeypatched in the batched frame the app now has.)
FI=S: the frame interval; NORESET=1: the dashboard's sections keep their heights across replies."""
import os, sys, time, threading, collections
sys.path.insert(0, '/work/main'); sys.path.insert(0, '/work/main/bench')
import app.screens.chat as chat
fi = float(os.environ.get("FI", "0.25"))
chat.FRAME_INTERVAL_S = fi; chat.MARKDOWN_INTERVAL_S = fi
from textual.screen import Screen
from app.widgets.dashboard import Dashboard
from app.widgets.chat_message import ChatMessage
T = collections.defaultdict(lambda: [0, 0.0])
STREAM = [False]
def wrap(cls, name, key, is_async=False):
    f = getattr(cls, name)
    key0 = key
    if is_async:
        async def g(*a, **k):
            key = key0 + ("@stream" if STREAM[0] else ""); t = time.thread_time(); r = await f(*a, **k); T[key][0] += 1; T[key][1] += time.thread_time() - t; return r
    else:
        def g(*a, **k):
            key = key0 + ("@stream" if STREAM[0] else ""); t = time.thread_time(); r = f(*a, **k); T[key][0] += 1; T[key][1] += time.thread_time() - t; return r
    setattr(cls, name, g)
if os.environ.get("NORESET"):
    from app.widgets.fit_static import FitStatic
    FitStatic.reset_fit = lambda self: None
wrap(Screen, "_refresh_layout", "layout")
wrap(Screen, "_compositor_refresh", "render")
wrap(Dashboard, "_paint", "dash_paint")
wrap(chat.ChatScreen, "_drain", "drain", is_async=True)
o_start, o_fin = chat.ChatScreen._start_reply, chat.ChatScreen._finish
async def _start(self, *a, **k):
    STREAM[0] = True; T["stream_cpu"][1] -= time.thread_time(); T["stream_cpu"][0] += 1
    return await o_start(self, *a, **k)
async def _fin(self, *a, **k):
    STREAM[0] = False; T["stream_cpu"][1] += time.thread_time()
    t = time.thread_time(); r = await o_fin(self, *a, **k); T["finish"][0] += 1; T["finish"][1] += time.thread_time() - t; return r
chat.ChatScreen._start_reply, chat.ChatScreen._finish = _start, _fin
import app_stream
orig = app_stream.run_app
async def run_app(*a, **k):
    T.clear()
    t = time.thread_time(); w = time.perf_counter()
    r = await orig(*a, **k)
    print(f"UI thread CPU {time.thread_time() - t:.2f} s over {time.perf_counter() - w:.2f} s wall;",
          {k: (v[0], round(v[1], 2)) for k, v in T.items()})
    return r
app_stream.run_app = run_app
sys.argv = ["app_stream.py"] + sys.argv[1:]
app_stream.main()
