"""Session 44: a chat database that cannot be written at start-up (a read-only data directory or
file, a full disk) showed no chats at all, as if they were gone; its chats are now shown from a copy
in memory (nothing new is saved, and the notice says both)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import store as store_mod
from app.store import DB_NAME, ChatStore, StoreError, open_store

from .fakes import FakeEngine
from .test_chat import SIZE, make_app, messages, notices, ready


def refuse_writing(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """ChatStore.open of ``path`` fails as a read-only folder makes it fail (we run as root here,
    where chmod does not stop writes); reading the file stays possible, as it is there."""
    real = ChatStore.open.__func__

    def open_(cls, p):
        if p is not None and Path(p) == path:
            raise StoreError("the chat database cannot be written here (read-only file or folder: "
                             "attempt to write a readonly database)", path=str(p))
        return real(cls, p)

    monkeypatch.setattr(ChatStore, "open", classmethod(open_))


def a_store_with_chats(path: Path) -> None:
    s = ChatStore.open(path)
    for c in range(3):
        cid = s.new_chat(f"chat {c}")
        s.add_message(cid, "user", f"question {c}")
        s.add_message(cid, "assistant", f"answer {c}", {"finish_reason": "eos"})
    s.close()


def test_an_unwritable_database_is_read_into_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / DB_NAME
    a_store_with_chats(path)
    before = path.read_bytes()
    refuse_writing(monkeypatch, path)
    store, why = open_store(path)
    assert store.path is None  # in memory: nothing is written to the file
    assert sorted(c.title for c in store.chats()) == ["chat 0", "chat 1", "chat 2"]
    chat = next(c for c in store.chats() if c.title == "chat 1")
    assert [m.content for m in store.messages(chat.id)] == ["question 1", "answer 1"]
    assert "read-only" in why and "shown from a copy in memory" in why and "nothing new is saved" in why
    cid = store.new_chat("new")  # the copy takes writes, in memory
    store.add_message(cid, "user", "x")
    store.close()
    assert path.read_bytes() == before


def test_the_copy_sees_a_log_not_yet_checkpointed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A WAL-mode file's latest messages may still be in its -wal log (another app open on it)."""
    path = tmp_path / DB_NAME
    a_store_with_chats(path)
    writer = ChatStore.open(path)  # kept open: its commit stays in the log
    writer._db.execute("PRAGMA wal_autocheckpoint = 0")
    cid = writer.new_chat("latest")
    writer.add_message(cid, "user", "in the log")
    refuse_writing(monkeypatch, path)
    try:
        store, _ = open_store(path)
        assert "latest" in [c.title for c in store.chats()]
    finally:
        writer.close()


def test_nothing_readable_still_gives_an_empty_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / DB_NAME
    path.write_bytes(b"")  # nothing in it to show
    refuse_writing(monkeypatch, path)
    store, why = open_store(path)
    assert store.path is None and store.chats() == [] and "copy" not in why
    assert store_mod._read_only_copy(tmp_path / "absent.db") is None


async def test_the_app_shows_the_chats_it_cannot_save_to(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = data_dir / DB_NAME
    a_store_with_chats(path)
    refuse_writing(monkeypatch, path)
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert [m.source for m in messages(app)] == ["question 2", "answer 2"]  # the latest chat, opened
        assert any("shown from a copy in memory" in text for text, _ in notices(app))
