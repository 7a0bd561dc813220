"""Review of the dashboard's numbers and the per-step views (session 41): each test failed before its fix."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator

import pytest
from rich.console import Console

from app.dashboard_stats import DashboardStats
from app.reply import ReplyRun
from app.sysinfo import GpuReading
from app.widgets.dashboard import BaselineInfo, speed_text
from app.widgets.draft_tree import render_tree
from app.widgets.status import StatusState
from engine.events import StepEvent

from .fakes import FakeEngine, tree_step
from .test_chat import make_app, ready, reply_done, send, status

WIDE = (140, 60)


class NoGpu:
    available = False

    def read(self) -> list[GpuReading]:
        return []


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.sysinfo.GpuProbe", NoGpu)


def plain(renderable: object, width: int = 42) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def stop_event(step: int) -> StepEvent:
    """What the engine yields when Esc ends a reply (generate.Decoder._final): no target forward."""
    return StepEvent(step=step, strategy="sd k=4", drafted=0, accepted=0, emitted=[], text="",
                     finished=True, finish_reason="stopped")


# ---- the status line and a bookkeeping event --------------------------------------------------------
def test_a_reply_keeps_its_last_real_step_over_a_bookkeeping_event() -> None:
    """ReplyRun.last_event (what the status line shows) is the last step that emitted tokens: the
    engine's stop event (drafted 0, accepted 0, numbered as the step before it) is no step."""
    run = ReplyRun([{"role": "user", "content": "hi"}], 16)
    real = StepEvent(step=3, strategy="sd k=4", drafted=5, accepted=3, emitted=[1, 2, 3, 4], text="abcd", ms=10.0)
    run._queue.put(real)
    run._queue.put(stop_event(3))
    run.drain()  # one drain takes both
    assert run.last_event is real and len(run.new_events) == 2
    st = StatusState(last_event=run.last_event)
    assert st.step_text().startswith("step 3: drafted 5, accepted 3")
    run = ReplyRun([{"role": "user", "content": "hi"}], 16)  # Esc during the prefill: no step at all
    run._queue.put(stop_event(0))
    run.drain()
    assert run.last_event is not None and StatusState(last_event=run.last_event).step_text() == ""
    assert StatusState(last_event=stop_event(3)).step_text() == "step 3"  # no counts it cannot know


class StoppedEngine(FakeEngine):
    """Two real steps, then the engine's bookkeeping "stopped" event (emitted nothing)."""

    def stream_chat(self, messages: list[dict[str, str]], max_new_tokens: int,
                    stop: threading.Event) -> Iterator[StepEvent]:
        self.calls.append(copy.deepcopy(messages))
        for i, chunk in enumerate(self.script, start=1):
            time.sleep(self.step_delay_s)
            yield self._event(i, chunk, self.strategy, False, None)
        yield stop_event(len(self.script))


async def test_a_stopped_replys_status_line_shows_its_last_step_not_the_stop_event() -> None:
    app = make_app(StoppedEngine(["Hello", " there"]))
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await reply_done(pilot)
        line = status(app)
        # the stop event (drafted 0, accepted 0) is not shown as a step: step 2's counts are
        assert "step 2: drafted 5, accepted 3" in line and "drafted 0" not in line, line
        assert "4.00 tok/step" in line


# ---- a reply without a step --------------------------------------------------------------------------
def test_no_step_shows_no_speed_nor_tokens_per_step() -> None:
    """Esc during the prefill (or a full context): only a bookkeeping event; nothing was decoded,
    so no rate of 0.0 tok/s nor a mean of 0.00 tokens per step reads as a measure."""
    stats = DashboardStats()
    stats.add(StepEvent(step=0, strategy="sd k=4", drafted=0, accepted=0, emitted=[], text="", finished=True,
                        finish_reason="stopped", prefill_s=0.5, prefill_tokens=100))
    text = plain(speed_text(stats, BaselineInfo(50.0, "ar measured at load, 48 tokens")))
    assert "now 0.0" not in text and "avg 0.0" not in text and "0.00 mean" not in text, text
    assert "tok/s —" in text and "tok/step —" in text
    # and with a step, the numbers as before
    stats.add(tree_step(1, ["a"], [-1], [0], "b", ms=10.0))
    text = plain(speed_text(stats))
    assert "tok/s now 200.0 · avg 200.0" in text and "tok/step 2.00 mean accepted length" in text


# ---- the draft tree's target token ------------------------------------------------------------------
def test_tree_shows_no_target_token_where_the_step_emitted_none() -> None:
    """The token limit cut the step after its accepted drafted tokens: the target's own token was
    not emitted, so the tree must not show one (the engine still sends an empty target segment)."""
    ev = tree_step(7, [" a", " b", " c"], [-1, 0, 1], [0, 1], "")
    ev.emitted = [11, 12]  # accepted 2, cut before the target's token
    ev.segments = [(" a b", "accepted"), ("", "target")]
    ev.finished, ev.finish_reason = True, "length"
    text = plain(render_tree(ev))
    assert "(target)" not in text and "''" not in text, text


def test_tree_names_an_end_of_text_target_token() -> None:
    """The target ended the reply: its token (EOS) has no text; the tree says so instead of ''."""
    ev = tree_step(7, [" a", " b"], [-1, 0], [0], "")
    ev.finished, ev.finish_reason = True, "eos"
    text = plain(render_tree(ev))
    assert "''" not in text, text
    assert "end of text" in text
    ar = StepEvent(step=3, strategy="ar greedy", drafted=0, accepted=0, emitted=[2], text="",
                   segments=[("", "accepted"), ("", "target")], finished=True, finish_reason="eos")
    text = plain(render_tree(ar))
    assert "''" not in text and "end of text" in text, text


# ---- a big draft tree ---------------------------------------------------------------------------------
def big_tree(n: int = 256, path: tuple[int, ...] = (15, 31, 47, 63)) -> StepEvent:
    """A wide tree of ``n`` nodes (optimal:256): 16 children of the root, each with a chain; the
    accepted path goes deep through the last child."""
    parents = [-1 if i < 16 else i - 16 for i in range(n)]
    return tree_step(9, [f" w{i}" for i in range(n)], parents, list(path), " T")


def test_a_big_tree_is_cut_to_a_readable_size_keeping_the_accepted_path() -> None:
    ev = big_tree()
    t0 = time.perf_counter()
    text = plain(render_tree(ev))
    lines = text.splitlines()
    assert len(lines) <= 50, len(lines)  # 207 lines before: the panel scrolled a tree no one reads
    for i in (15, 31, 47, 63):  # the accepted path, whole, marked, in order
        assert f"✓ ' w{i}'" in text
    assert text.index("' w15'") < text.index("' w31'") < text.index("' w63'")
    assert "→ ' T' (target)" in text
    shown = sum(text.count(f"' w{i}'") for i in range(256))
    assert f"{256 - shown} more draft nodes" in text, text
    assert time.perf_counter() - t0 < 1.0
    # a child is never shown without its parent: the first rejected siblings come first, under the root
    assert "' w0'" in text


def test_a_small_tree_is_shown_whole() -> None:
    ev = big_tree(40, (15, 31))
    text = plain(render_tree(ev))
    assert "more draft nodes" not in text
    assert all(f"' w{i}'" in text for i in range(40))


# ---- stepping back through a long reply's trees ------------------------------------------------------------
def test_a_step_stepped_back_to_stays_on_display_as_the_history_drops_its_oldest() -> None:
    """The dashboard keeps a reply's last MAX_HISTORY steps; past that each new step drops the
    oldest one, and the tree the user stepped back to (with [) must stay the one shown, not slide
    one step newer at every step that arrives."""
    from collections import deque

    from app.dashboard_stats import MAX_HISTORY
    from app.widgets.draft_tree import DraftTreeView

    history: deque[StepEvent] = deque(maxlen=MAX_HISTORY)
    for i in range(1, MAX_HISTORY + 1):
        history.append(tree_step(i, ["a"], [-1], [0], "b"))
    view = DraftTreeView()
    view.show(list(history))
    view.action_older()
    view.action_older()
    pinned = view.shown
    assert pinned is not None and pinned.step == MAX_HISTORY - 2
    for i in range(MAX_HISTORY + 1, MAX_HISTORY + 6):  # five more steps: the five oldest dropped
        history.append(tree_step(i, ["a"], [-1], [0], "b"))
        view.show(list(history))
    assert view.shown is pinned, view.shown.step if view.shown else None
    view.action_newer()
    assert view.shown is not None and view.shown.step == MAX_HISTORY - 1
    for i in range(MAX_HISTORY + 6, 2 * MAX_HISTORY + 10):  # the step shown itself dropped: the oldest kept
        history.append(tree_step(i, ["a"], [-1], [0], "b"))
    view.show(list(history))
    assert view.shown is history[0]
