"""Session 44: messages a failed write left unsaved (a full disk) were saved only with a later
message: a user who read "Chat not saved", freed the disk and quit, or opened another chat, lost
them. Now they are tried again every RETRY_UNSAVED_S, before another chat opens, and at quit."""

from __future__ import annotations

from pathlib import Path

from app.store import DB_NAME, ChatStore

from .fakes import FakeEngine
from .test_chat import SIZE, make_app, notices, reply_done, send
from .test_startup_review_s43 import saved_chat, second_exchange_on_a_full_disk


async def test_unsaved_messages_are_saved_at_quit_once_there_is_room(data_dir: Path) -> None:
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        disk = await second_exchange_on_a_full_disk(pilot, app)
        disk.full = False  # room again; the user quits without another message
    assert saved_chat(data_dir / DB_NAME) == [("user", "first"), ("assistant", "ok"), ("user", "second"), ("assistant", "ok")]
    store = ChatStore.open(data_dir / DB_NAME)
    late = store.messages(store.chats()[0].id)[3]  # the reply saved late keeps its stats
    assert late.finish_reason == "eos" and (late.stats or {}).get("tokens")
    store.close()


async def test_the_timer_retries_quietly_and_says_when_saved(data_dir: Path) -> None:
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        disk = await second_exchange_on_a_full_disk(pilot, app)
        errors = sum(sev == "error" for _, sev in notices(app))
        assert app.chat._retry_unsaved() == 2  # still full: nothing saved, no new toast
        await pilot.pause()
        assert sum(sev == "error" for _, sev in notices(app)) == errors
        disk.full = False
        assert app.chat._retry_unsaved() == 0
        await pilot.pause()
        assert any("Saved 2 messages of this chat" in m for m, _ in notices(app))
        assert saved_chat(data_dir / DB_NAME)[-2:] == [("user", "second"), ("assistant", "ok")]
        await send(pilot, "third")  # the next message goes after them, once
        await reply_done(pilot)
        app.store._db = disk.db  # type: ignore[assignment]
    assert [c for _, c in saved_chat(data_dir / DB_NAME)] == ["first", "ok", "second", "ok", "third", "ok"]


async def test_opening_another_chat_says_when_they_could_not_be_saved(data_dir: Path) -> None:
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        disk = await second_exchange_on_a_full_disk(pilot, app)
        await app.chat._show_chat(None)  # a new chat (Ctrl+N), the disk still full
        await pilot.pause()
        assert any("2 messages of the chat you left could not be saved" in m for m, _ in notices(app))
        disk.full = False
        app.store._db = disk.db  # type: ignore[assignment]


async def test_opening_another_chat_saves_them_first(data_dir: Path) -> None:
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        disk = await second_exchange_on_a_full_disk(pilot, app)
        disk.full = False
        await app.chat._show_chat(None)
        app.store._db = disk.db  # type: ignore[assignment]
    assert [c for _, c in saved_chat(data_dir / DB_NAME)] == ["first", "ok", "second", "ok"]
