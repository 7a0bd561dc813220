"""No full garbage collection while a reply streams (app/gc_hold.py): the chat screen holds the
collector's oldest generation from a reply's start to its finish, then the interpreter's threshold
is back, whether the reply ended, was stopped, or the app quit mid-reply."""

from __future__ import annotations

import gc
import threading

from app.gc_hold import FULL_COLLECTIONS, FullCollectionsHeld

from .fakes import FakeEngine
from .test_chat import SIZE, make_app, ready, reply_done, send, wait_for


def test_hold_nests_and_restores_the_threshold() -> None:
    before = gc.get_threshold()
    held = FullCollectionsHeld()
    held.hold()
    held.hold()
    assert held.held and gc.get_threshold() == (before[0], before[1], FullCollectionsHeld.HELD_THRESHOLD)
    held.release()
    assert held.held and gc.get_threshold()[2] == FullCollectionsHeld.HELD_THRESHOLD
    held.release()
    assert not held.held and gc.get_threshold() == before
    held.release()  # one release too many: nothing changes
    assert gc.get_threshold() == before


def test_young_collections_go_on_while_held() -> None:
    """Held, the young generations still collect (a reply's cyclic garbage is freed as it
    streams); only the oldest generation's count keeps growing, never reaching its threshold."""
    before = gc.get_threshold()
    held = FullCollectionsHeld()
    try:
        gc.set_threshold(100, 2, 2)
        gc.collect()
        held.hold()
        freed = []

        def count(phase: str, info: dict) -> None:
            if phase == "stop" and info["generation"] < 2:
                freed.append(info["collected"])

        gc.callbacks.append(count)
        try:
            for _ in range(20000):
                a: list = []
                a.append(a)  # a cycle: only the collector frees it
        finally:
            gc.callbacks.remove(count)
        assert sum(freed) > 15000 and gc.get_count()[2] > 2
        held.release()
        assert gc.get_threshold() == (100, 2, 2)
    finally:
        gc.set_threshold(*before)


def _gated_app() -> tuple[threading.Semaphore, object]:
    """An app whose engine streams three steps, each when the test releases the gate once."""
    gate = threading.Semaphore(0)
    return gate, make_app(FakeEngine(["one", " two", " three"], gate=gate, step_delay_s=0.0))


async def _first_step(pilot, gate: threading.Semaphore) -> None:
    await ready(pilot)
    await send(pilot, "hi")
    gate.release(1)


async def test_a_streaming_reply_holds_full_collections_until_it_finishes() -> None:
    before = gc.get_threshold()
    gate, app = _gated_app()
    async with app.run_test(size=SIZE) as pilot:
        await _first_step(pilot, gate)
        await wait_for(pilot, lambda: "generating" in str(app.chat.status_line.render()))
        assert FULL_COLLECTIONS.held and gc.get_threshold()[2] == FullCollectionsHeld.HELD_THRESHOLD
        gate.release(2)
        await reply_done(pilot)
        assert not FULL_COLLECTIONS.held and gc.get_threshold() == before


async def test_quitting_mid_reply_gives_the_threshold_back() -> None:
    before = gc.get_threshold()
    gate, app = _gated_app()
    async with app.run_test(size=SIZE) as pilot:
        await _first_step(pilot, gate)
        await wait_for(pilot, lambda: FULL_COLLECTIONS.held)
    gate.release(5)
    assert not FULL_COLLECTIONS.held and gc.get_threshold() == before
