"""Ctrl+P "Continue the last reply": a reply cut by the token limit (or stopped) goes on in place."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.screens.chat import LENGTH_NOTICE, continued_stats

from .fakes import BlockingEngine, FakeEngine
from .test_chat import SIZE, make_app, messages, notices, ready, reply_done, send, status, wait_for
from .test_chat_features import chat, saved, shown


async def palette(pilot, label: str) -> None:
    await pilot.press("ctrl+p")
    await pilot.pause()
    await pilot.press(*label)
    await pilot.pause(0.3)
    await pilot.press("enter")
    await pilot.pause()


async def test_a_reply_cut_at_the_limit_continues_in_the_same_message(data_dir: Path) -> None:
    engine = FakeEngine(["Once upon", " a time"], finish_reason="length")
    app = make_app(engine, max_new_tokens=64)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "Tell a story")
        assert (LENGTH_NOTICE.format(n=64), "information") in notices(app)
        assert "length" in status(app)
        (first_chat,) = saved(data_dir).chats()
        first = saved(data_dir).messages(first_chat.id)[-1].stats
        engine.script, engine.finish_reason = [" there", " was a fox."], "eos"
        await palette(pilot, "Continue the last reply")
        await reply_done(pilot)
        # the engine got the cut reply as the turn to go on from
        assert engine.calls[-1] == [{"role": "user", "content": "Tell a story"},
                                    {"role": "assistant", "content": "Once upon a time"}]
        assert shown(app) == [("user", "Tell a story"), ("assistant", "Once upon a time there was a fox.")]
        assert app.chat.conversation[-1] == {"role": "assistant", "content": "Once upon a time there was a fox."}
        assert "eos" in status(app)
    (record,) = saved(data_dir).chats()
    rows = saved(data_dir).messages(record.id)
    assert [(m.role, m.content) for m in rows] == [("user", "Tell a story"), ("assistant", "Once upon a time there was a fox.")]
    assert rows[-1].finish_reason == "eos"
    # the saved stats are the whole reply's: both parts' tokens and steps, counted as continued once
    assert rows[-1].stats["tokens"] > first["tokens"] and rows[-1].stats["steps"] > first["steps"]
    assert rows[-1].stats["continued"] == 1 and first.get("continued") is None


async def test_a_continuation_with_nothing_back_leaves_the_reply_and_its_mark(data_dir: Path) -> None:
    engine = BlockingEngine(["Half"])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        await wait_for(pilot, engine.blocking.is_set)
        await pilot.press("escape")
        await reply_done(pilot)
        assert messages(app)[-1].source == "Half\n\n*(stopped)*"
        engine.script = []  # the continuation is stopped before its first token
        engine.blocking.clear()
        await app.chat.action_continue_reply()
        await wait_for(pilot, engine.blocking.is_set)
        await pilot.press("escape")
        await reply_done(pilot)
        assert messages(app)[-1].source == "Half\n\n*(stopped)*" and messages(app)[-1].has_class("-stopped")
        assert app.chat.conversation[-1] == {"role": "assistant", "content": "Half"}
        assert any("brought nothing back" in m for m, _ in notices(app))
    (record,) = saved(data_dir).chats()
    rows = saved(data_dir).messages(record.id)
    assert [m.content for m in rows] == ["go", "Half"] and rows[-1].finish_reason == "stopped"


async def test_quitting_while_continuing_keeps_what_came(data_dir: Path) -> None:
    engine = FakeEngine(["Start"], finish_reason="length")
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await chat(pilot, "go")
        blocking = BlockingEngine([" and more"])
        app.chat.session = blocking
        await app.chat.action_continue_reply()
        await wait_for(pilot, blocking.blocking.is_set)
        await wait_for(pilot, lambda: "more" in messages(app)[-1].source)
        await pilot.press("ctrl+q")
    (record,) = saved(data_dir).chats()
    rows = saved(data_dir).messages(record.id)
    assert [m.content for m in rows] == ["go", "Start and more"] and rows[-1].finish_reason == "stopped"


async def test_nothing_to_continue() -> None:
    app = make_app(FakeEngine(["Hi"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await app.chat.action_continue_reply()
        await pilot.pause()
        assert any("No reply to continue" in m for m, _ in notices(app))


async def test_a_reply_that_filled_the_context_does_not_continue_and_a_cut_character_is_rewritten(data_dir: Path) -> None:
    engine = FakeEngine(["Full"], finish_reason="context")
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "go")
        calls = len(engine.calls)
        await app.chat.action_continue_reply()
        await pilot.pause()
        assert len(engine.calls) == calls and any("cannot go on" in m for m, _ in notices(app))
        # a reply cut inside a character (U+FFFD at its end): the continuation writes it whole
        engine.script, engine.finish_reason = ["日本\ufffd"], "length"
        await chat(pilot, "Japan?")
        engine.script, engine.finish_reason = ["語です"], "eos"
        await app.chat.action_continue_reply()
        await reply_done(pilot)
        assert app.chat.conversation[-1]["content"] == "日本語です"


def test_store_replaces_the_last_reply_in_one_write(tmp_path: Path) -> None:
    from app.store import ChatStore, StoreError

    store = ChatStore.open(tmp_path / "s.db")
    c = store.new_chat()
    store.add_message(c, "user", "hi")
    store.add_message(c, "assistant", "Hel", {"finish_reason": "length"})
    store.replace_last(c, "assistant", "Hello there.", {"finish_reason": "eos"})
    rows = store.messages(c)
    assert [(m.idx, m.content, m.finish_reason) for m in rows] == [(0, "hi", None), (1, "Hello there.", "eos")]
    store.add_message(c, "user", "again")
    with pytest.raises(StoreError, match="last message is 'user', not 'assistant'"):
        store.replace_last(c, "assistant", "x")
    assert store.messages(c)[-1].content == "again"


def test_continued_stats_add_the_parts() -> None:
    a = {"tokens": 24, "steps": 12, "tok_s": 12.0, "mean_accepted": 2.0, "finish_reason": "length", "strategy": "pld"}
    b = {"tokens": 30, "steps": 10, "tok_s": 30.0, "mean_accepted": 3.0, "finish_reason": "eos", "strategy": "sd"}
    got = continued_stats(a, b)
    # 24 tokens in 2 s, 30 in 1 s: 54 tokens in 3 s
    assert got == {"tokens": 54, "steps": 22, "tok_s": 18.0, "mean_accepted": round(54 / 22, 3), "finish_reason": "eos",
                   "strategy": "sd", "strategies": ["pld", "sd"], "continued": 1}
    assert continued_stats(got, b)["continued"] == 2 and continued_stats(got, b)["tokens"] == 84
    assert continued_stats(got, b)["strategies"] == ["pld", "sd"]  # the same strategy again: no new change
    assert "strategies" not in continued_stats({**a, "strategy": "sd"}, b)  # one strategy throughout
    assert continued_stats(None, b) == {**b, "continued": 1}  # no stats saved with the first part
    assert continued_stats({"finish_reason": "stopped"}, b) == {**b, "continued": 1}
    assert continued_stats({**a, "tok_s": 0.0}, b)["tok_s"] == 30.0  # a part without a rate: the timed part's
    assert continued_stats({**a, "continued": None}, b)["continued"] == 1  # odd values from an old database
    assert continued_stats({**a, "continued": "x"}, b) == {**b, "continued": 1}


def test_a_reply_switched_mid_way_saves_every_strategy_in_order() -> None:
    """A live switch (Ctrl+S) mid-reply: the stats keep the last step's strategy and list each change."""
    from app.reply import ReplyRun
    from app.screens.chat import reply_stats
    from engine.events import StepEvent

    run = ReplyRun([{"role": "user", "content": "hi"}], 16)
    for i, label in enumerate(["pld k<=8 auto greedy T=0", "pld k<=8 auto greedy T=0", "sd k=4 greedy T=0", "ar greedy T=0"]):
        run._queue.put(StepEvent(step=i, strategy=label, drafted=0, accepted=0, emitted=[7], text="x"))
    run.drain()
    stats = reply_stats(run, "length")
    assert stats["strategy"] == "ar greedy T=0"
    assert stats["strategies"] == ["pld k<=8 auto greedy T=0", "sd k=4 greedy T=0", "ar greedy T=0"]
    one = ReplyRun([{"role": "user", "content": "hi"}], 16)
    one._queue.put(StepEvent(step=0, strategy="ar greedy T=0", drafted=0, accepted=0, emitted=[7], text="x"))
    one.drain()
    assert "strategies" not in reply_stats(one, "length")
