"""The chat database (app.store): location, schema version, permissions, WAL, immediate commits,
strategies as settings, and a kill -9 in the middle of a reply."""

from __future__ import annotations

import os
import select
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app import store as store_mod
from app.store import (
    DB_NAME, SCHEMA_VERSION, ChatStore, StoreError, data_dir, open_store, strategy_from_dict, title_from,
)
from engine.strategy import PRESETS, StrategyError, preset

REPO = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def peek(path: Path, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Read with a second, independent connection (what another process would see)."""
    db = sqlite3.connect(path)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


@pytest.fixture
def db_path(data_dir: Path) -> Path:
    return data_dir / DB_NAME


# ---- where ---------------------------------------------------------------------------------------
def test_data_dir_env_override_then_xdg_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "mine"
    monkeypatch.delenv("SPECCHAT_DATA_DIR")
    assert data_dir() == tmp_path / "xdg" / "specchat"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")  # the XDG spec says to ignore relative paths
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_dir() == tmp_path / "home" / ".local" / "share" / "specchat"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert data_dir() == tmp_path / "home" / ".local" / "share" / "specchat"


# ---- creating, versions, permissions ------------------------------------------------------------------
def test_new_database_is_private_versioned_and_in_wal_mode(db_path: Path) -> None:
    store = ChatStore.open(db_path)
    store.set_setting("theme", "nord")  # a write, so the WAL file exists
    assert mode(db_path.parent) == 0o700
    assert mode(db_path) == 0o600
    assert mode(db_path.with_name(DB_NAME + "-wal")) == 0o600  # SQLite copies the database's mode
    assert peek(db_path, "SELECT value FROM meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
    assert peek(db_path, "PRAGMA journal_mode") == [("wal",)]
    tables = {name for (name,) in peek(db_path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"meta", "chats", "messages", "settings"} <= tables
    columns = {name for (_, name, *_rest) in peek(db_path, "PRAGMA table_info(messages)")}
    assert columns == {"chat_id", "idx", "role", "content", "created", "stats"}
    store.close()
    assert ChatStore.open(db_path).get_setting("theme") == "nord"  # reopening keeps everything


def _set_schema_version(db_path: Path, value: str) -> None:
    """A saved database whose meta table says ``value`` (a newer version, or a damaged entry)."""
    ChatStore.open(db_path).close()
    db = sqlite3.connect(db_path)
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (value,))
    db.commit()
    db.close()


def test_a_database_from_a_newer_version_is_refused_in_one_line(db_path: Path) -> None:
    _set_schema_version(db_path, '99')
    with pytest.raises(StoreError) as info:
        ChatStore.open(db_path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(db_path)) and "schema version 99 is newer" in message
    assert "SPECCHAT_DATA_DIR" in message
    assert peek(db_path, "SELECT value FROM meta WHERE key = 'schema_version'") == [("99",)]  # untouched
    store, error = open_store()  # the app goes on in memory, and says why
    assert store.path is None and error == message


def test_not_a_database_is_a_one_line_error(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError) as info:
        ChatStore.open(db_path)
    assert "\n" not in str(info.value) and "not a usable chat database" in str(info.value)


def test_a_damaged_schema_version_is_a_one_line_error(db_path: Path) -> None:
    """A schema_version that is not a number (a damaged or hand-edited file) is refused like any
    unusable file: int() raised a ValueError past open_store, a traceback at the app's start."""
    _set_schema_version(db_path, 'x')
    with pytest.raises(StoreError) as info:
        ChatStore.open(db_path)
    assert "\n" not in str(info.value) and "not a usable chat database" in str(info.value)
    assert "schema_version is 'x'" in str(info.value)
    store, error = open_store()  # the app goes on in memory, and says why
    assert store.path is None and error == str(info.value)


def test_damaged_values_read_as_missing_or_as_text(db_path: Path) -> None:
    """Valid JSON of the wrong kind (a list or a string as a message's stats, a list as its
    finish_reason or as a chat's strategy) reads as missing, and text columns holding another type
    (an integer, a blob) read as text: the chat screen, the chat list and the prompt history
    assume both (a list's .get raised; a blob's .replace raised)."""
    store = ChatStore.open(db_path)
    chat = store.new_chat(title="t")
    store.add_message(chat, "user", "hello")
    store.add_message(chat, "assistant", "hi", {"finish_reason": "stopped"})
    store.add_message(chat, "user", "more")
    store.add_message(chat, "assistant", "ok", {"finish_reason": "eos"})
    store.close()
    db = sqlite3.connect(db_path)
    db.execute("UPDATE messages SET stats = '[1, 2]' WHERE idx = 1")
    db.execute("""UPDATE messages SET stats = '{"finish_reason": [1]}' WHERE idx = 3""")
    db.execute("UPDATE messages SET content = X'68c3a9ff' WHERE idx = 0")  # a blob, not UTF-8 at its end
    db.execute("UPDATE messages SET content = 5 WHERE idx = 2")
    db.execute("UPDATE chats SET title = 7, updated = 8, strategy = '[\"sd\"]'")
    db.commit()
    db.close()
    store = ChatStore.open(db_path)
    (record,) = store.chats()
    assert (record.title, record.updated, record.strategy) == ("7", "8", None)
    msgs = store.messages(chat)
    assert [m.content for m in msgs] == ["h\u00e9\ufffd", "hi", "5", "ok"]
    assert [m.stats for m in msgs] == [None, None, None, {"finish_reason": [1]}]
    assert [m.finish_reason for m in msgs] == [None, None, None, None]
    assert store.prompt_history() == ["h\u00e9\ufffd", "5"]


def test_migrations_upgrade_older_files_all_or_nothing(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ChatStore.open(db_path)
    chat = store.new_chat()
    store.add_message(chat, "user", "kept across the upgrade")
    store.close()

    def add_pinned(db: sqlite3.Connection) -> None:
        db.execute("ALTER TABLE chats ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")

    def broken(db: sqlite3.Connection) -> None:
        db.execute("ALTER TABLE chats ADD COLUMN half_done INTEGER")
        raise sqlite3.OperationalError("migration failed halfway")

    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(store_mod.MIGRATIONS, 1, broken)
    with pytest.raises(StoreError, match="migration failed halfway"):
        store_mod.ChatStore.open(db_path)
    columns = {name for (_, name, *_rest) in peek(db_path, "PRAGMA table_info(chats)")}
    assert "half_done" not in columns  # rolled back
    assert peek(db_path, "SELECT value FROM meta WHERE key = 'schema_version'") == [("1",)]

    monkeypatch.setitem(store_mod.MIGRATIONS, 1, add_pinned)
    upgraded = store_mod.ChatStore.open(db_path)
    assert peek(db_path, "SELECT value FROM meta WHERE key = 'schema_version'") == [("2",)]
    assert peek(db_path, "SELECT pinned FROM chats") == [(0,)]
    assert [m.content for m in upgraded.messages(chat)] == ["kept across the upgrade"]


# ---- chats and messages ---------------------------------------------------------------------------
def test_every_message_is_committed_when_added(db_path: Path) -> None:
    store = ChatStore.open(db_path)
    chat = store.new_chat(model="FakeLM", strategy=preset("sd").to_dict())
    store.add_message(chat, "user", "hello")
    assert peek(db_path, "SELECT role, content FROM messages") == [("user", "hello")]  # store still open
    stats = {"tokens": 3, "tok_s": 12.5, "mean_accepted": 2.5, "finish_reason": "eos"}
    store.add_message(chat, "assistant", "hi there", stats, strategy=preset("tree").to_dict())
    rows = peek(db_path, "SELECT idx, role, content, stats FROM messages ORDER BY idx")
    assert [(i, r, c) for i, r, c, _ in rows] == [(0, "user", "hello"), (1, "assistant", "hi there")]
    saved = store.messages(chat)
    assert saved[1].stats == stats and saved[1].finish_reason == "eos" and saved[0].stats is None
    record = store.chat(chat)
    assert record is not None and record.title == "hello" and record.model == "FakeLM"
    assert record.strategy is not None and record.strategy["name"] == "tree" and record.messages == 2


def test_titles_order_truncate_delete_and_history(db_path: Path) -> None:
    store = ChatStore.open(db_path)
    first, second = store.new_chat(), store.new_chat()
    long = "explain   speculative decoding\nwith draft trees " + "and more " * 10
    store.add_message(first, "user", long)
    store.add_message(first, "assistant", "sure")
    store.add_message(second, "user", "same")
    store.add_message(second, "user", "same")
    store.add_message(first, "user", "again")  # first is now the most recently updated
    chats = store.chats()
    assert [c.id for c in chats] == [first, second]
    assert chats[0].title == title_from(long) and len(chats[0].title) <= 60 and chats[0].title.endswith("…")
    assert "\n" not in chats[0].title and "  " not in chats[0].title
    assert store.prompt_history() == [long, "same", "again"]  # oldest first, repeats merged
    assert store.prompt_history(limit=1) == ["again"]

    assert store.truncate(first, 1) == 2
    assert [m.content for m in store.messages(first)] == [long]
    store.rename_chat(first, "Trees")
    assert store.chat(first).title == "Trees"  # type: ignore[union-attr]
    store.add_message(first, "user", "renamed chats keep their title")
    assert store.chat(first).title == "Trees"  # type: ignore[union-attr]
    store.delete_chat(first)
    assert [c.id for c in store.chats()] == [second]
    assert peek(db_path, "SELECT COUNT(*) FROM messages WHERE chat_id = ?", (first,)) == [(0,)]  # cascaded


def test_settings_round_trip_json(db_path: Path) -> None:
    store = ChatStore.open(db_path)
    assert store.get_setting("dashboard_visible", "unset") == "unset"
    store.set_setting("dashboard_visible", False)
    store.set_setting("strategy", preset("mab").to_dict())
    store.set_setting("dashboard_visible", True)
    assert store.get_setting("dashboard_visible") is True
    assert strategy_from_dict(store.get_setting("strategy")) == preset("mab")


def test_in_memory_store_works_and_saves_nothing(data_dir: Path) -> None:
    store = ChatStore.open(None)
    chat = store.new_chat()
    store.add_message(chat, "user", "ephemeral")
    assert [m.content for m in store.messages(chat)] == ["ephemeral"]
    assert store.path is None and not data_dir.exists()


def test_writes_after_close_are_one_line_store_errors(db_path: Path) -> None:
    store = ChatStore.open(db_path)
    store.close()
    with pytest.raises(StoreError) as info:
        store.set_setting("theme", "nord")
    assert "\n" not in str(info.value) and str(db_path) in str(info.value)


# ---- strategies -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_survives_to_dict_and_back(name: str) -> None:
    for strategy in (preset(name), preset(name, temperature=0.7, top_p=0.9, seed=3)):
        assert strategy_from_dict(strategy.to_dict()) == strategy


@pytest.mark.parametrize("data, words", [
    ("sd", "not a table"),
    ({**preset("sd").to_dict(), "warp": 9}, "unknown settings: warp"),
    ({**preset("sd").to_dict(), "draft_len": "five"}, "draft_len is 'five'"),
    ({**preset("sd").to_dict(), "verify": "nope"}, "unknown verifier"),
    ({**preset("tree").to_dict(), "tree": ["x"]}, "damaged"),
])
def test_invalid_saved_strategies_are_one_line_errors(data: object, words: str) -> None:
    with pytest.raises(StrategyError) as info:
        strategy_from_dict(data)
    assert words in str(info.value) and "\n" not in str(info.value)


# ---- crash safety ---------------------------------------------------------------------------------
KILLED_APP = textwrap.dedent("""
    import asyncio, threading
    from app.main import SpecChatApp
    from app.widgets import ChatMessage, PromptInput
    from tests.app.fakes import FakeEngine

    class Engine(FakeEngine):
        '''The first reply finishes; the second streams a little and then never ends.'''

        def stream_chat(self, messages, max_new_tokens, stop):
            if self.calls:
                self.calls.append(messages)
                yield self._event(1, "never saved", self.strategy, False, None)
                threading.Event().wait()
            yield from super().stream_chat(messages, max_new_tokens, stop)

    async def wait_for(pilot, condition):
        while not condition():
            await pilot.pause(0.02)

    async def main():
        engine = Engine(["Complete", " reply."])
        app = SpecChatApp(lambda: engine)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.session is not None)
            for text in ("first", "second"):
                app.query_one(PromptInput).text = text
                await pilot.press("enter")
                if text == "first":
                    await wait_for(pilot, lambda: not app.chat.busy)
            await wait_for(pilot, lambda: "never saved" in list(app.chat.query(ChatMessage))[-1].source)
            print("MID-REPLY", flush=True)
            await asyncio.sleep(120)

    asyncio.run(main())
""")


def test_kill_9_mid_reply_keeps_every_completed_message(data_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "killed_app.py"
    script.write_text(KILLED_APP)
    env = {**os.environ, "SPECCHAT_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        readable, _, _ = select.select([proc.stdout], [], [], 90)
        line = proc.stdout.readline() if readable else ""
        if line.strip() != "MID-REPLY":
            proc.kill()
            raise AssertionError(f"the app never got mid-reply: {line!r} {proc.stderr.read()[-2000:]}")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    db_path = data_dir / DB_NAME
    assert db_path.with_name(DB_NAME + "-wal").exists()  # the commits were still in the WAL
    store = ChatStore.open(db_path)
    assert peek(db_path, "PRAGMA integrity_check") == [("ok",)]
    (chat,) = store.chats()
    assert chat.title == "first"
    saved = [(m.role, m.content) for m in store.messages(chat.id)]
    assert saved == [("user", "first"), ("assistant", "Complete reply."), ("user", "second")]
    assert store.messages(chat.id)[1].finish_reason == "eos"
    assert store.prompt_history() == ["first", "second"]
