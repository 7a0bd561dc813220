import os, sys, time, collections, traceback
sys.path.insert(0, '/work/main'); sys.path.insert(0, '/work/main/bench')
import app.screens.chat as chat
from textual.screen import Screen
from textual.widget import Widget
STREAM = [False]; C = collections.Counter()
o_tu = Screen._on_timer_update
def tu(self):
    if STREAM[0]:
        C[("timer", self._layout_required, self._scroll_required, self._repaint_required, bool(self._dirty_widgets))] += 1
    return o_tu(self)
Screen._on_timer_update = tu
o_ref = Widget.refresh
def ref(self, *regions, repaint=True, layout=False, recompose=False):
    if STREAM[0] and layout:
        C[("layout-by", type(self).__name__, "".join(traceback.format_stack(limit=4)[0].split("\n")[0].split("/")[-1:]))] += 1
    return o_ref(self, *regions, repaint=repaint, layout=layout, recompose=recompose)
Widget.refresh = ref
o_start, o_fin, o_dr = chat.ChatScreen._start_reply, chat.ChatScreen._finish, chat.ChatScreen._drain
async def _start(self, *a, **k):
    STREAM[0] = True; return await o_start(self, *a, **k)
async def _fin(self, *a, **k):
    STREAM[0] = False; return await o_fin(self, *a, **k)
async def _dr(self, *a, **k):
    C["drain"] += 1; return await o_dr(self, *a, **k)
chat.ChatScreen._start_reply, chat.ChatScreen._finish, chat.ChatScreen._drain = _start, _fin, _dr
import app_stream
sys.argv = ["app_stream.py"] + sys.argv[1:]
app_stream.main()
for k, v in C.most_common(25): print(v, k)
