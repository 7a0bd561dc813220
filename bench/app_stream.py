"""The chat app's streaming rate against the engine's own, same session, same process.

Runs SpecChatApp headless (Textual's run_test, 120 x 40: the app composes and renders every frame,
only the terminal writes are skipped), sends each prompt in a new chat, waits for the reply, and
reads its GenerationSummary (new tokens / decode time, the dashboard's "avg"). Then the same
messages through ``session.stream_chat`` in a thread with no UI. One process, one session, the
same strategy and settings; the app's load-time plain-decoding baseline is awaited first.

Chats go to a fresh temporary SPECCHAT_DATA_DIR unless one is set.

Usage: .venv/bin/python bench/app_stream.py [--strategy ar] [--prompts 4] [--max-new-tokens 128] [--dtype auto]
       [--gil-switch-ms MS]  (the app's GIL switch interval for this run; default app.main.GIL_SWITCH_S)
       [--profile FILE]   (cProfile of the UI thread's event loop while the app streams)
       [--one-chat]       (every prompt in one growing conversation, both ways, and each reply's
                           rate printed: how the app's cost grows with the conversation)
       [--no-gc-hold]     (full collections allowed while a reply streams: app/gc_hold.py off)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


async def _wait(pilot, cond, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("the app did not get there in time")
        # Not pilot.pause: it waits for every widget to go idle, UI-thread work of its own that
        # took up to half the app's rate in a long chat (bench/results/2026-11-26-app-frames/).
        await asyncio.sleep(0.05)


async def run_app(session, prompts: list[str], strategy, max_new: int, profile: str | None, one_chat: bool = False) -> list[dict]:
    from app.main import SpecChatApp
    from app.widgets.prompt import PromptInput

    from app.screens.chat import ChatScreen

    done: list = []  # the replies the chat finished (pilot.press can return after a short one ends)
    finish = ChatScreen._finish

    async def _finish(self, run):
        done.append(run)
        await finish(self, run)

    ChatScreen._finish = _finish
    app = SpecChatApp(lambda: session, initial_strategy=strategy, max_new_tokens=max_new)
    out = []
    async with app.run_test(size=(120, 40)) as pilot:
        await _wait(pilot, lambda: app.session is not None, 120)
        await _wait(pilot, lambda: app.chat.dashboard.baseline is not None, 120)
        prof = None
        if profile:
            import cProfile

            prof = cProfile.Profile()
        for i, text in enumerate(prompts):
            if i == 0 or not one_chat:
                await pilot.press("ctrl+n")
                await pilot.pause()
            box = app.query_one(PromptInput)
            box.focus()
            await pilot.pause()
            box.text = text
            n_done = len(done)
            t0 = time.perf_counter()
            if prof:
                prof.enable()
            await pilot.press("enter")
            await _wait(pilot, lambda: len(done) > n_done and not app.chat.busy, 600)
            if prof:
                prof.disable()
            wall = time.perf_counter() - t0
            summ = done[-1].summary
            out.append({"tokens": summ.new_tokens, "tok_s": summ.tokens_per_s, "wall_s": wall,
                        "context": getattr(getattr(done[-1], "last_event", None), "position", 0)})
        if prof:
            prof.dump_stats(profile)
    return out


def run_headless(session, prompts: list[str], max_new: int, one_chat: bool = False) -> list[dict]:
    from engine.events import GenerationSummary

    out = []
    history: list[dict] = []
    for text in prompts:
        summ = GenerationSummary()
        msgs = (history if one_chat else []) + [{"role": "user", "content": text}]
        reply: list[str] = []
        pos = [0]

        def go() -> None:
            for ev in session.stream_chat(msgs, max_new, threading.Event()):
                summ.add(ev)
                reply.append(getattr(ev, "text", "") or "")
                pos[0] = getattr(ev, "position", 0)

        t0 = time.perf_counter()
        th = threading.Thread(target=go)
        th.start()
        th.join()
        out.append({"tokens": summ.new_tokens, "tok_s": summ.tokens_per_s, "wall_s": time.perf_counter() - t0, "context": pos[0]})
        history = msgs + [{"role": "assistant", "content": "".join(reply)}]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategy", default="ar")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--one-chat", action="store_true", help="every prompt in one conversation (it grows reply by reply)")
    ap.add_argument("--gil-switch-ms", type=float, default=None,
                    help="the app's GIL switch interval (app.main.GIL_SWITCH_S) for this run, in ms")
    ap.add_argument("--dtype", default="auto", help="compute type, as `specchat chat --dtype` (default auto: q8 where faster)")
    ap.add_argument("--no-gc-hold", action="store_true",
                    help="let full garbage collections run while a reply streams (app/gc_hold.py off, for A/Bs)")
    a = ap.parse_args()
    if a.no_gc_hold:
        from app.gc_hold import FULL_COLLECTIONS

        FULL_COLLECTIONS.hold = FULL_COLLECTIONS.release = lambda: None  # type: ignore[method-assign]
    if "SPECCHAT_DATA_DIR" not in os.environ:  # the chats it sends stay out of the user's history
        os.environ["SPECCHAT_DATA_DIR"] = tempfile.mkdtemp(prefix="specchat-app-stream-")
    from engine.session import ChatSession
    from engine.strategy import from_spec

    prompts = [p["text"] for p in json.loads((REPO / "assets/prompts/bench.json").read_text())][: a.prompts]
    import gc

    gc_stats = {"t": [0.0] * 3, "n": [0] * 3, "t0": 0.0}

    def _gc_cb(phase: str, info: dict) -> None:  # time in each generation's collections, any thread
        if phase == "start":
            gc_stats["t0"] = time.perf_counter()
        else:
            g = info["generation"]
            gc_stats["t"][g] += time.perf_counter() - gc_stats["t0"]
            gc_stats["n"][g] += 1
    if a.gil_switch_ms is not None:
        import app.main

        app.main.GIL_SWITCH_S = a.gil_switch_ms / 1000.0
    strategy = from_spec(a.strategy)
    session = ChatSession.load(strategy=strategy, dtype=a.dtype)  # as `specchat chat` loads it (--dtype auto)
    gc.callbacks.append(_gc_cb)
    app_rows = asyncio.run(run_app(session, prompts, strategy, a.max_new_tokens, a.profile, a.one_chat))
    gc.callbacks.remove(_gc_cb)
    print("garbage collections while the app ran: " + "  ".join(
        f"gen{g} {gc_stats['n'][g]} x {1000 * gc_stats['t'][g] / max(gc_stats['n'][g], 1):.1f} ms" for g in range(3)))
    session.strategy = strategy
    head_rows = run_headless(session, prompts, a.max_new_tokens, a.one_chat)
    if a.one_chat:
        print("reply  context   app tok/s   no-UI tok/s   app/no-UI")
        for i, (ra, rh) in enumerate(zip(app_rows, head_rows)):
            print(f"{i + 1:5d}  {ra.get('context') or 0:7d}  {ra['tok_s']:10.1f}  {rh['tok_s']:12.1f}  {ra['tok_s'] / max(rh['tok_s'], 1e-9):10.2f}")
    for name, rows in (("app (headless Textual)", app_rows), ("stream_chat, no UI", head_rows)):
        toks = sum(r["tokens"] for r in rows)
        print(f"{name:<24} {strategy.label():<10} tokens {toks:5d}  decode {toks / sum(r['tokens'] / r['tok_s'] for r in rows if r['tok_s']):6.1f} tok/s"
              f"  per reply {statistics.median(r['tok_s'] for r in rows):6.1f} (median)  wall {sum(r['wall_s'] for r in rows):6.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
