"""The chat UI's own CPU cost per streamed reply as a conversation grows (no model, no torch).

Runs SpecChatApp headless (Textual's run_test, 120 x 40) on a fake engine that streams a fixed
Markdown reply (paragraphs, a list, a code block) word by word at a steady pace, all replies in one
chat, and prints for each reply the process CPU time it took: the fake engine only sleeps, so that
is the UI thread's work (Markdown parsing, layout, rendering, the dashboard). On the 2-core machine
this is CPU taken from the decode loop; `bench/app_stream.py --one-chat` measures what that costs
a real model's tokens/s.

Usage: .venv/bin/python bench/app_ui_cost.py [--replies 8] [--step-ms 8] [--profile FILE [--profile-reply N]]

Also prints the garbage collector's work while the replies ran (count and mean time per generation).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

REPLY = """Here is a short answer with a few parts, the way a chat model often writes one.

First, the idea in one paragraph: speculative decoding drafts several tokens cheaply and lets the
large model check them all at once, so each expensive step can keep more than one token.

- The drafter proposes a few tokens ahead.
- The target scores every proposal in one pass.
- The longest agreeing prefix is kept, plus one token of the target's own.
- Nothing about the output changes: it is exactly what plain decoding writes.

```python
def speculate(target, drafter, prompt, k=5):
    draft = drafter.generate(prompt, k)
    logits = target.forward(prompt + draft)
    keep = longest_agreeing_prefix(draft, logits)
    return prompt + draft[:keep] + [logits[keep].argmax()]
```

In short, **the speedup comes from accepted drafts**, and the cost is one extra pass of a small model.
"""


def _words(text: str) -> list[str]:
    out, word = [], ""
    for ch in text:
        word += ch
        if ch in " \n":
            out.append(word)
            word = ""
    return out + ([word] if word else [])


async def run(replies: int, step_ms: float, profile: str | None, profile_reply: int) -> list[tuple[float, float, int]]:
    from app.main import SpecChatApp
    from app.screens.chat import ChatScreen
    from app.widgets.chat_message import ChatMessage
    from app.widgets.prompt import PromptInput
    from engine.strategy import preset
    from tests.app.fakes import FakeEngine

    done: list = []
    finish_cpu: list[float] = []  # the UI CPU of each reply's _finish (save, final render)
    finish = ChatScreen._finish

    async def _finish(self, run):
        c0 = time.process_time()
        await finish(self, run)
        finish_cpu.append(time.process_time() - c0)
        done.append(run)

    ChatScreen._finish = _finish
    engine = FakeEngine(_words(REPLY), strategy=preset("ar"), step_delay_s=step_ms / 1000)
    app = SpecChatApp(lambda: engine, initial_strategy=preset("ar"), max_new_tokens=4096)
    rows = []
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    async with app.run_test(size=(120, 40)) as pilot:
        while app.session is None:
            await pilot.pause(0.02)
        await pilot.press("ctrl+n")
        await pilot.pause()
        import gc

        gc_time = [0.0, 0.0, 0.0]
        gc_count = [0, 0, 0]
        gc_t0 = [0.0]

        def _gc_cb(phase, info):
            if phase == "start":
                gc_t0[0] = time.perf_counter()
            else:
                gc_time[info["generation"]] += time.perf_counter() - gc_t0[0]
                gc_count[info["generation"]] += 1

        gc.callbacks.append(_gc_cb)
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(2.0)
        idle = (time.process_time() - c0) / (time.perf_counter() - t0)
        for i in range(replies):
            box = app.query_one(PromptInput)
            box.focus()
            await pilot.pause()
            box.text = f"Question {i + 1}: how does speculative decoding work?"
            n = len(done)
            c0, t0 = time.process_time(), time.perf_counter()
            if prof and i == profile_reply - 1:
                prof.enable()
            await pilot.press("enter")
            while len(done) <= n or app.chat.busy:
                await asyncio.sleep(0.05)  # not pilot.pause: it waits on every widget, work of its own
            if prof and i == profile_reply - 1:
                prof.disable()
            rows.append((time.process_time() - c0, time.perf_counter() - t0, finish_cpu[-1],
                         sum(1 for _ in app.query(ChatMessage).results())))
    if prof:
        prof.dump_stats(profile)
    gc.callbacks.remove(_gc_cb)
    print("gc: " + "  ".join(f"gen{g} {gc_count[g]} x {1000 * gc_time[g] / max(gc_count[g], 1):.2f} ms = {gc_time[g]:.2f} s" for g in range(3)))
    return rows, idle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replies", type=int, default=8)
    ap.add_argument("--step-ms", type=float, default=8.0, help="the fake engine's time per word (default 8 ms: ~125 words/s)")
    ap.add_argument("--profile", default=None, help="cProfile of one reply (--profile-reply, default the last) to this file")
    ap.add_argument("--profile-reply", type=int, default=0)
    a = ap.parse_args()
    os.environ.setdefault("SPECCHAT_DATA_DIR", tempfile.mkdtemp(prefix="specchat-ui-cost-"))
    rows, idle = asyncio.run(run(a.replies, a.step_ms, a.profile, a.profile_reply or a.replies))
    words = len(_words(REPLY))
    print(f"reply  messages   UI cpu s   (at the end)   wall s   UI cpu / wall   ({words} words a reply, {a.step_ms:g} ms a word)")
    for i, (cpu, wall, fin, n) in enumerate(rows, start=1):
        print(f"{i:5d}  {n:8d}  {cpu:9.2f}  {fin:13.2f}  {wall:7.2f}  {cpu / wall:14.2f}")
    print(f"idle app before the first reply: {idle:.2f} s of CPU a second")
    print(f"total UI cpu {sum(r[0] for r in rows):.2f} s over {sum(r[1] for r in rows):.2f} s wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
