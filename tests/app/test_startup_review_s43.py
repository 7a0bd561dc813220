"""Session 43's review of the app's start-up and bad input: a damaged chat database is kept aside
(never written into, never emptied) and a fresh one used, and a message a full disk kept from being
saved is saved before the next one (the chat on disk never skips a message)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from app.store import DB_NAME, ChatStore, open_store

from .fakes import FakeEngine
from .test_chat import SIZE, make_app, notices, ready, reply_done, send


def saved_chat(path: Path, chat_id: int | None = None) -> list[tuple[str, str]]:
    """(role, content) of one chat's saved messages (the newest chat by default), read apart from the app."""
    db = sqlite3.connect(path)
    try:
        if chat_id is None:
            chat_id = db.execute("SELECT id FROM chats ORDER BY updated DESC, id DESC LIMIT 1").fetchone()[0]
        return db.execute("SELECT role, content FROM messages WHERE chat_id = ? ORDER BY idx", (chat_id,)).fetchall()
    finally:
        db.close()


def a_database_with_chats(path: Path, chats: int = 30) -> bytes:
    """A real chat database of many pages (the pages a bad disk may damage), closed; its bytes."""
    store = ChatStore.open(path)
    for c in range(chats):
        chat_id = store.new_chat()
        for i in range(5):
            store.add_message(chat_id, "user", f"question {c}.{i} " * 40)
            store.add_message(chat_id, "assistant", f"answer {c}.{i} " * 60, {"finish_reason": "eos"})
    store.close()
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    return path.read_bytes()


def damage(path: Path, offset: int, n: int) -> bytes:
    """Overwrite ``n`` bytes at ``offset`` with garbage; the damaged file's bytes."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes((i * 37 + 11) % 256 for i in range(n)))
    return path.read_bytes()


def kept_aside(data_dir: Path) -> list[Path]:
    return sorted(p for p in data_dir.iterdir() if p.name.startswith(DB_NAME + ".damaged")
                  and not p.name.endswith(("-wal", "-shm")))


# ---- a damaged database ----------------------------------------------------------------------------
def test_a_database_damaged_inside_is_kept_aside_not_written_into(data_dir: Path) -> None:
    """Pages damaged in the middle of the file (a bad disk, a crash mid-copy): the file opened
    (its header and schema were fine), the chats could not be read ("database disk image is
    malformed"), and the app went on writing new chats into the damaged file (worse damage to what
    a recovery tool could still read). Now it is moved aside, untouched, and a fresh file used."""
    path = data_dir / DB_NAME
    data_dir.mkdir(parents=True)
    a_database_with_chats(path)
    damaged = damage(path, 4096 * 60, 4096 * 3)
    store, error = open_store()
    assert error is not None and "\n" not in error
    aside = kept_aside(data_dir)
    assert len(aside) == 1 and aside[0].read_bytes() == damaged  # kept, as it was
    assert str(aside[0]) in error and "damaged" in error
    assert store.path == path  # a fresh database in its place: chats are saved again
    chat_id = store.new_chat()
    store.add_message(chat_id, "user", "hello again")
    store.close()
    assert saved_chat(path) == [("user", "hello again")]


def test_a_file_that_is_not_a_database_is_kept_aside(data_dir: Path) -> None:
    """Garbage where the database was ("file is not a database"): kept aside under a new name, and
    chats are saved again (before, every start went on in memory, saving nothing, until the user
    found and moved the file)."""
    path = data_dir / DB_NAME
    data_dir.mkdir(parents=True)
    path.write_bytes(b"garbage " * 2000)
    store, error = open_store()
    assert error is not None and "\n" not in error
    aside = kept_aside(data_dir)
    assert len(aside) == 1 and aside[0].read_bytes() == b"garbage " * 2000
    assert str(aside[0]) in error
    assert store.path == path
    store.close()


def test_a_foreign_or_newer_database_is_not_moved(data_dir: Path) -> None:
    """Only damage moves a file: a newer specchat's database, or one that cannot be opened (a
    read-only place), stays where it is, and the app goes on in memory as before."""
    path = data_dir / DB_NAME
    ChatStore.open(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    store, error = open_store()
    assert store.path is None and error is not None and "newer" in error
    assert kept_aside(data_dir) == [] and path.exists()


async def test_the_app_says_where_the_damaged_database_went_and_saves_to_a_fresh_one(data_dir: Path) -> None:
    path = data_dir / DB_NAME
    data_dir.mkdir(parents=True)
    a_database_with_chats(path)
    damaged = damage(path, 4096 * 2, 4096)
    app = make_app(FakeEngine(["fine"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        aside = kept_aside(data_dir)
        assert len(aside) == 1 and aside[0].read_bytes() == damaged
        said = [m for m, _ in notices(app) if str(aside[0]) in m]
        assert said and all("\n" not in m for m in said)
        assert app.store.path == path
        await send(pilot, "hello")
        await reply_done(pilot)
    assert saved_chat(path) == [("user", "hello"), ("assistant", "fine")]


# ---- a full disk ---------------------------------------------------------------------------------------
class FullDisk:
    """The store's connection, whose writes fail as SQLite's do on a full disk while ``full``."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.full = False

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if self.full and sql.lstrip().split()[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            raise sqlite3.OperationalError("database or disk is full")
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


async def second_exchange_on_a_full_disk(pilot: Any, app: Any) -> FullDisk:
    """"first" and its reply saved, then the disk full (still full on return) for "second" and its
    reply: "Chat not saved"."""
    await ready(pilot)
    await send(pilot, "first")
    await reply_done(pilot)
    disk = FullDisk(app.store._db)
    app.store._db = disk
    disk.full = True
    await send(pilot, "second")
    await reply_done(pilot)
    assert any("disk is full" in m and sev == "error" for m, sev in notices(app))
    return disk


async def test_a_message_the_full_disk_refused_is_saved_before_the_next_one(data_dir: Path) -> None:
    """The disk filled up as a message was sent: "Chat not saved", and the chat goes on. Once
    there was room again, the next reply was saved right after the earlier reply, without the
    message it answered (measured in tmux on a full tmpfs: two assistant messages in a row on disk,
    the user's message lost for good). Now the messages left unsaved are saved first, in order."""
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        disk = await second_exchange_on_a_full_disk(pilot, app)
        disk.full = False  # room again
        await send(pilot, "third")
        await reply_done(pilot)
        app.store._db = disk.db  # type: ignore[assignment]
    assert saved_chat(data_dir / DB_NAME) == [
        ("user", "first"), ("assistant", "ok"), ("user", "second"), ("assistant", "ok"),
        ("user", "third"), ("assistant", "ok")]
    store = ChatStore.open(data_dir / DB_NAME)
    late = store.messages(store.chats()[0].id)[3]  # the reply saved late keeps its stats
    assert late.role == "assistant" and late.finish_reason == "eos" and (late.stats or {}).get("tokens")
    store.close()


async def test_a_new_chat_the_full_disk_refused_is_saved_whole_later(data_dir: Path) -> None:
    """The first message of a new chat (with a system prompt) could not be saved: once there is
    room, the chat is saved with its system prompt and every message, not from the latest on."""
    app = make_app(FakeEngine(["ok"]), system_prompt="Be brief.")
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        disk = FullDisk(app.store._db)
        app.store._db = disk  # type: ignore[assignment]
        disk.full = True
        await send(pilot, "one")
        await reply_done(pilot)
        disk.full = False
        await send(pilot, "two")
        await reply_done(pilot)
        app.store._db = disk.db  # type: ignore[assignment]
    assert saved_chat(data_dir / DB_NAME) == [
        ("system", "Be brief."), ("user", "one"), ("assistant", "ok"), ("user", "two"), ("assistant", "ok")]


def test_the_damaged_files_wal_goes_aside_with_it(data_dir: Path) -> None:
    """A damaged file's write-ahead log (its last commits, where the app was killed) is moved with
    it, under the matching name, as it was: left behind, it would be read into the fresh database;
    and closing a read-write connection to the damaged file deleted it (checked read-only now)."""
    path = data_dir / DB_NAME
    data_dir.mkdir(parents=True)
    path.write_bytes(b"garbage " * 2000)  # "file is not a database"
    Path(f"{path}-wal").write_bytes(b"its log " * 100)
    Path(f"{path}-shm").write_bytes(b"its index " * 100)
    fresh, error = open_store()
    assert error is not None and fresh.path == path
    fresh.close()
    (aside,) = kept_aside(data_dir)[:1]
    assert aside.read_bytes() == b"garbage " * 2000
    assert Path(f"{aside}-wal").read_bytes() == b"its log " * 100
    assert Path(f"{aside}-shm").exists()  # (an index SQLite rebuilds from the log: moved, not kept as it was)
    assert sorted(p.name for p in data_dir.iterdir() if p.name.startswith(DB_NAME + "-")) in ([], [f"{DB_NAME}-shm", f"{DB_NAME}-wal"])


def test_a_store_that_cannot_be_written_is_not_called_damaged(monkeypatch, tmp_path) -> None:
    """A read-only data directory or a full disk at start-up read "not a usable chat database:
    unable to open database file" / "disk I/O error", which sounds like a damaged file."""
    import sqlite3

    from app import store

    path = tmp_path / "specchat.db"
    path.touch()
    monkeypatch.setattr(store.os, "access", lambda p, mode: False)
    why = store._why_unusable(sqlite3.OperationalError("unable to open database file"), path)
    assert why.startswith("the chat database cannot be written here (read-only") and "usable" not in why
    monkeypatch.setattr(store.os, "access", lambda p, mode: True)
    why = store._why_unusable(sqlite3.OperationalError("disk I/O error"), path)
    assert "disk may be full" in why
    assert store._why_unusable(sqlite3.OperationalError("something else"), path).startswith("not a usable chat database")
