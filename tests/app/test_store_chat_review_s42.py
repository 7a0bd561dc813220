"""Review (session 42) of two windows on one chat (Continue, the system prompt) and of opening a
chat that last ran another model or strategy: each test here failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.store import DB_NAME, ChatChanged, ChatStore
from app.widgets.chat_list import ChatList
from engine.strategy import preset

from .fakes import FakeEngine
from .test_chat import SIZE, make_app, notices, ready, reply_done
from .test_chat_features import chat, saved, shown
from .test_continue import palette
from .test_system_prompt import open_dialog, type_into

CHANGED = "changed in another specchat window"


def contents(store: ChatStore, chat_id: int) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in store.messages(chat_id)]


# ---- the store: replace_last and set_system check what the writer expects -----------------------
def test_replace_last_writes_nothing_over_what_another_window_saved(tmp_path: Path) -> None:
    """replace_last replaced whatever the chat's last message was: a Continue in one window
    overwrote the reply another window had saved after it (or its continuation of the same one)."""
    mine = ChatStore.open(tmp_path / "s.db")
    other = ChatStore.open(tmp_path / "s.db")
    c = mine.new_chat()
    mine.add_message(c, "user", "Tell a story")
    mine.add_message(c, "assistant", "Once upon a time")
    other.add_message(c, "user", "from B")
    other.add_message(c, "assistant", "B's answer")
    with pytest.raises(ChatChanged):  # the chat has 4 messages, not the 2 this window knows
        mine.replace_last(c, "assistant", "Once upon a time there was a fox.", {"finish_reason": "eos"},
                          expect=2, was="Once upon a time")
    other.truncate(c, 2)
    other.replace_last(c, "assistant", "Once upon a time, said B.")  # (the old call, unchecked, still works)
    with pytest.raises(ChatChanged):  # as many messages, but the last one is not the one this window has
        mine.replace_last(c, "assistant", "Once upon a time there was a fox.", expect=2, was="Once upon a time")
    assert contents(other, c) == [("user", "Tell a story"), ("assistant", "Once upon a time, said B.")]
    assert other.messages(c)[-1].stats is None
    mine.replace_last(c, "assistant", "Once upon a time, said B. The end.", expect=2, was="Once upon a time, said B.")
    assert contents(other, c)[-1] == ("assistant", "Once upon a time, said B. The end.")


def test_set_system_writes_nothing_over_what_another_window_saved(tmp_path: Path) -> None:
    """set_system changed the prompt whatever the chat held: one window's change replaced or
    removed the prompt another window had set since, and moved messages it had never seen."""
    mine = ChatStore.open(tmp_path / "s.db")
    other = ChatStore.open(tmp_path / "s.db")
    c = mine.new_chat()
    mine.add_message(c, "user", "one")
    mine.add_message(c, "assistant", "Sure.")
    other.set_system(c, "Be rude.")  # (the old call, unchecked, still works)
    with pytest.raises(ChatChanged):  # 3 messages, not 2
        mine.set_system(c, "Be kind.", expect=2, was="")
    with pytest.raises(ChatChanged):  # as many messages, but another prompt than this window's
        mine.set_system(c, "", expect=3, was="Be kind.")
    other.add_message(c, "user", "from B")
    with pytest.raises(ChatChanged):
        mine.set_system(c, "", expect=3, was="Be rude.")
    assert contents(other, c) == [("system", "Be rude."), ("user", "one"), ("assistant", "Sure."), ("user", "from B")]
    mine.set_system(c, "Be kind.", expect=4, was="Be rude.")
    assert contents(other, c)[0] == ("system", "Be kind.")


# ---- the app: Continue and the system prompt go on in a copy ------------------------------------
async def test_a_continue_does_not_overwrite_what_another_window_saved(data_dir: Path) -> None:
    """Continue replaced the chat's last saved message, whatever it was: with another window on
    the same chat, the other window's answer became this window's continued reply. Now nothing of
    the other window's is touched and this window's conversation goes on in a copy."""
    engine = FakeEngine(["Once upon", " a time"], finish_reason="length")
    app = make_app(engine, max_new_tokens=64)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "Tell a story")
        other = saved(data_dir)  # the other window, on the same chat
        cid = other.chats()[0].id
        other.add_message(cid, "user", "from B")
        other.add_message(cid, "assistant", "B's answer")
        engine.script, engine.finish_reason = [" there", " was a fox."], "eos"
        await palette(pilot, "Continue the last reply")
        await reply_done(pilot)
        assert contents(other, cid) == [("user", "Tell a story"), ("assistant", "Once upon a time"),
                                        ("user", "from B"), ("assistant", "B's answer")]
        copy = app.chat.chat_id
        assert copy is not None and copy != cid and app.chat.chat_title == "Tell a story (copy)"
        assert contents(other, copy) == [("user", "Tell a story"), ("assistant", "Once upon a time there was a fox.")]
        last = other.messages(copy)[-1]
        assert last.finish_reason == "eos" and last.stats["continued"] == 1
        assert shown(app) == [("user", "Tell a story"), ("assistant", "Once upon a time there was a fox.")]
        assert sum(CHANGED in m for m, s in notices(app) if s == "warning") == 1
        await chat(pilot, "And then?")  # the copy goes on as any chat
        assert contents(other, copy)[-2:] == [("user", "And then?"), ("assistant", " there was a fox.")]


async def test_a_continue_does_not_overwrite_another_windows_continuation_of_the_same_reply(data_dir: Path) -> None:
    engine = FakeEngine(["Once upon", " a time"], finish_reason="length")
    app = make_app(engine, max_new_tokens=64)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "Tell a story")
        other = saved(data_dir)
        cid = other.chats()[0].id
        other.replace_last(cid, "assistant", "Once upon a time, said B.", {"finish_reason": "eos"})
        engine.script, engine.finish_reason = [" there", " was a fox."], "eos"
        await palette(pilot, "Continue the last reply")
        await reply_done(pilot)
        assert contents(other, cid)[-1] == ("assistant", "Once upon a time, said B.")
        assert app.chat.chat_id != cid
        assert contents(other, app.chat.chat_id)[-1] == ("assistant", "Once upon a time there was a fox.")
        assert any(CHANGED in m for m, _ in notices(app))


async def test_a_system_prompt_change_does_not_take_or_clobber_another_windows_messages(data_dir: Path) -> None:
    """set_system moved every saved message of the chat, the other window's too, and the chat was
    then shown again from the store: this window showed (and sent the model) the other window's
    messages as its own; and clearing or replacing the prompt removed the one the other window
    had set. Now the chat keeps the other window's messages and prompt, and this window's
    conversation goes on in a copy with the new prompt."""
    engine = FakeEngine(["Sure", "."])
    app = make_app(engine)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "one")
        other = saved(data_dir)
        cid = other.chats()[0].id
        other.add_message(cid, "user", "from B")
        other.add_message(cid, "assistant", "B's answer")
        await type_into(pilot, await open_dialog(pilot, app), "Be brief.", for_new=False)
        assert contents(other, cid) == [("user", "one"), ("assistant", "Sure."), ("user", "from B"), ("assistant", "B's answer")]
        copy = app.chat.chat_id
        assert copy is not None and copy != cid and app.chat.chat_title == "one (copy)"
        assert contents(other, copy) == [("system", "Be brief."), ("user", "one"), ("assistant", "Sure.")]
        assert other.messages(copy)[-1].finish_reason == "eos"
        assert shown(app) == [("system", "*System prompt:* Be brief."), ("user", "one"), ("assistant", "Sure.")]
        assert app.chat.chat_list.display is False and any(CHANGED in m for m, _ in notices(app))
        await chat(pilot, "two")
        assert engine.calls[-1] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "one"},
                                    {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "two"}]
        assert [c for _, c in contents(other, copy)] == ["Be brief.", "one", "Sure.", "two", "Sure."]

        # the other window replaces the copy's prompt (as many messages): clearing it here keeps theirs
        other.set_system(copy, "Be rude.")
        app._notifications.clear()
        await type_into(pilot, await open_dialog(pilot, app), "", for_new=False)
        assert contents(other, copy)[0] == ("system", "Be rude.")
        assert app.chat.chat_id not in (cid, copy)
        assert contents(other, app.chat.chat_id) == [("user", "one"), ("assistant", "Sure."),
                                                     ("user", "two"), ("assistant", "Sure.")]
        assert [r for r, _ in shown(app)] == ["user", "assistant"] * 2
        assert any(CHANGED in m for m, _ in notices(app))


# ---- opening a chat that last ran another model or strategy -------------------------------------
async def test_opening_a_chat_that_ran_another_model_or_strategy_says_what_replies_now_use(data_dir: Path) -> None:
    """An old chat opened from the list went on with whatever model and strategy were loaded, and
    nothing said that its replies so far came from another model or strategy."""
    engine = FakeEngine(["ok"], strategy=preset("sd"))
    now = engine.description
    store = ChatStore.open(data_dir / DB_NAME)
    chats: dict[str, int] = {}
    for name, model, strategy in [
        ("other model", "SmolLM2-135M-Instruct (GGUF Q4_1)", preset("sd", draft_len=3).to_dict()),
        ("other strategy", now, preset("pld").to_dict()),
        ("other model, damaged strategy", "SmolLM2-360M", {"name": "sd", "draft_len": "five"}),
        ("damaged strategy", now, {"name": "sd", "bogus": 1}),
        ("nothing recorded", "", None),
        ("same", now, preset("sd").to_dict()),  # the most recent: open at start
    ]:
        chats[name] = store.new_chat(name, model=model, strategy=strategy)
        store.add_message(chats[name], "user", f"in {name}")
    store.close()
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert app.chat.chat_id == chats["same"]

        async def opened(name: str) -> list[str]:
            app._notifications.clear()
            await app.chat._chat_opened(ChatList.Opened(chats[name]))
            await pilot.pause()
            assert app.chat.chat_id == chats[name]
            return [m for m, _ in notices(app) if m.startswith("This chat last ran")]

        app._notifications.clear()
        await pilot.press("ctrl+l")
        await pilot.pause()
        await pilot.press("end", "enter")  # the list's last (oldest) chat
        await pilot.pause()
        assert app.chat.chat_id == chats["other model"]
        assert [m for m, _ in notices(app) if m.startswith("This chat last ran")] == [
            f"This chat last ran SmolLM2-135M-Instruct (GGUF Q4_1) with sd k=3 greedy T=0; "
            f"replies now come from {now} with sd k=5 greedy T=0."]
        assert engine.strategy == preset("sd")  # nothing else is loaded or picked for it
        assert await opened("other strategy") == [
            f"This chat last ran {now} with pld k=8 greedy T=0; replies now come from {now} with sd k=5 greedy T=0."]
        assert await opened("other model, damaged strategy") == [
            f"This chat last ran SmolLM2-360M; replies now come from {now}."]
        assert await opened("damaged strategy") == []
        assert await opened("nothing recorded") == []
        assert await opened("same") == []


async def test_the_chat_open_at_start_says_when_it_ran_another_model(data_dir: Path) -> None:
    """At start-up the last chat opens before any model is loaded; when the model comes, a chat that
    ran another one says so (as one opened from the list does), and a matching one says nothing."""
    engine = FakeEngine(["ok"], strategy=preset("sd"))
    store = ChatStore.open(data_dir / DB_NAME)
    chat = store.new_chat("older", model="SmolLM2-360M", strategy=preset("pld").to_dict())
    store.add_message(chat, "user", "hello")
    store.close()
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert app.chat.chat_id == chat
        assert [m for m, _ in notices(app) if m.startswith("This chat last ran")] == [
            f"This chat last ran SmolLM2-360M with pld k=8 greedy T=0; "
            f"replies now come from {engine.description} with sd k=5 greedy T=0."]
    store = ChatStore.open(data_dir / DB_NAME)
    store.add_message(chat, "assistant", "hi", model=engine.description, strategy=preset("sd").to_dict())
    store.close()
    app = make_app(FakeEngine(["ok"], strategy=preset("sd")))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert app.chat.chat_id == chat
        assert [m for m, _ in notices(app) if m.startswith("This chat last ran")] == []
