"""Review (session 41) of the chat list, saved history, export and the command palette: each test
here failed before its fix."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from app import export
from app.export import chat_markdown, export_chat
from app.store import DB_NAME, ChatStore

from .fakes import BlockingEngine, FakeEngine
from .test_chat import SIZE, make_app, notices, ready, reply_done, screen_text, send, wait_for


async def chat(pilot: object, *texts: str) -> None:
    for text in texts:
        await send(pilot, text)  # type: ignore[arg-type]
        await reply_done(pilot)  # type: ignore[arg-type]


def headings(markdown: str) -> list[str]:
    """The level-2 headings a Markdown renderer finds (the export's "## You" / "## Assistant")."""
    tokens = MarkdownIt("commonmark").parse(markdown)
    return [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h2"]


# ---- export -------------------------------------------------------------------------------------
def test_a_second_export_in_the_same_second_does_not_overwrite_the_first(tmp_path: Path) -> None:
    """Two exports of same-titled chats (every all-non-ASCII title slugs to "chat") in the same
    second went to one file: O_TRUNC overwrote the first export, and both toasts named that file."""
    at = datetime(2026, 11, 29, 12, 0, 0)
    first = export_chat(tmp_path, "日本語の質問", [{"role": "user", "content": "first chat"}], now=at)
    second = export_chat(tmp_path, "中文问题", [{"role": "user", "content": "second chat"}], now=at)
    assert first != second
    assert "first chat" in first.read_text() and "second chat" in second.read_text()
    assert first.name == "chat-20261129-120000.md" and second.name == "chat-20261129-120000-2.md"
    assert (second.stat().st_mode & 0o777) == 0o600


def test_a_reply_cut_inside_a_code_block_does_not_swallow_the_rest_of_the_export() -> None:
    """A reply stopped (Esc) or cut at the token limit inside a ``` block left the fence open: every
    later message of the exported chat rendered as part of that code block."""
    conv = [{"role": "user", "content": "write a loop"},
            {"role": "assistant", "content": "Here:\n\n```python\nfor i in range(3):\n    print("},
            {"role": "user", "content": "go on"},
            {"role": "assistant", "content": "~~~~\nnested ``` stays code\n~~~"}]  # a longer tilde fence: "~~~" does not close it
    md = chat_markdown("Loops", conv)
    assert headings(md) == ["You", "Assistant", "You", "Assistant"]
    assert "```python\nfor i in range(3):\n    print(\n```\n" in md
    # closed fences and fence-like lines inside them are left as they are
    done = "```\na\n```\n\n````md\n```\ninner\n```\n````"
    assert export.close_fences(done) == done
    assert export.close_fences("~~~~\nx\n~~~") == "~~~~\nx\n~~~\n~~~~"
    assert export.close_fences("``` `not a fence`\nx") == "``` `not a fence`\nx"  # backticks in a ``` info string: no fence


# ---- search -------------------------------------------------------------------------------------
def test_search_ignores_case_beyond_ascii(tmp_path: Path) -> None:
    """SQLite's LIKE folds only ASCII letters: "ÉTÉ" did not find "été", nor "über" "Über"."""
    store = ChatStore.open(tmp_path / "s.db")
    a = store.new_chat("Vacances d'été")
    b = store.new_chat()
    store.add_message(b, "user", "ÜBER DIE BRÜCKE")
    c = store.new_chat("Straße")
    store.new_chat("plain ascii 100%")
    assert [x.id for x in store.chats("ÉTÉ")] == [a]
    assert [x.id for x in store.chats("über die")] == [b]
    assert [x.id for x in store.chats("STRAßE")] == [c]
    assert [x.title for x in store.chats("ASCII 100%")] == ["plain ascii 100%"]  # % still literal
    assert store.chats("_") == []


def test_listing_and_searching_a_thousand_chats_is_quick(tmp_path: Path) -> None:
    store = ChatStore.open(tmp_path / "s.db")
    db = store._db
    db.execute("BEGIN")
    for i in range(1000):
        cid = db.execute("INSERT INTO chats (title, created, updated) VALUES (?, '', ?)",
                         (f"chat {i}", f"2026-01-01T00:00:{i:06d}")).lastrowid
        for j in range(10):
            db.execute("INSERT INTO messages VALUES (?, ?, ?, ?, '', NULL)",
                       (cid, j, "user" if j % 2 == 0 else "assistant", f"Ünïcode message {i}.{j} " * 40))
    db.execute("COMMIT")
    start = time.perf_counter()
    every = store.chats()
    found = store.chats("ünïcode MESSAGE 999.9")
    assert time.perf_counter() - start < 1.0
    assert len(every) == 1000 and every[0].title == "chat 999" and every[-1].title == "chat 0"  # newest first
    assert [x.title for x in found] == ["chat 999"]


# ---- chat list ----------------------------------------------------------------------------------
async def test_titles_and_searches_with_markup_characters_show_as_typed(data_dir: Path) -> None:
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "[/] closing [bold]tag")
        await pilot.press("ctrl+l", "r", "ctrl+u", *"[red]x[/] [/", "enter")
        await pilot.pause()
        assert "● [red]x[/] [/" in screen_text(app)
        await pilot.press("slash", *"[/")
        await pilot.pause()
        assert [c.title for c in app.chat.chat_list.chats] == ["[red]x[/] [/"]
        await pilot.press("escape", "delete", "delete")
        await pilot.pause()
        assert ("Press Del again to delete “[red]x[/] [/”.", "warning") in notices(app)
        assert app.chat.chat_id is None and ChatStore.open(data_dir / DB_NAME).chats() == []


# ---- two instances on one database --------------------------------------------------------------
async def test_a_regenerate_does_not_delete_what_another_window_saved_in_the_same_chat(data_dir: Path) -> None:
    """A second specchat opens the most recently updated chat, the one the first is showing; what
    each sent interleaved in the file, and Ctrl+R in the first truncated by its own index: it
    deleted the other window's answer and the first window's own last message. Now a write that
    finds the chat changed by another window writes nothing there: this window's conversation goes
    on as a copy, the other's messages stay as they were."""
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "from A 1")
        other = ChatStore.open(data_dir / DB_NAME)  # the other window, on the same chat
        cid = other.chats()[0].id
        other.add_message(cid, "user", "from B")
        other.add_message(cid, "assistant", "B's answer")
        await chat(pilot, "from A 2")
        await pilot.press("ctrl+r")
        await reply_done(pilot)
        assert [m.content for m in other.messages(cid)] == ["from A 1", "ok", "from B", "B's answer"]
        copy = app.chat.chat_id
        assert copy != cid and app.chat.chat_title.endswith("(copy)")
        assert [m.content for m in other.messages(copy)] == ["from A 1", "ok", "from A 2", "ok"]
        assert any("changed in another specchat window" in m for m, _ in notices(app))
        await chat(pilot, "from A 3")  # the copy goes on as any chat
        assert [m.content for m in other.messages(copy)][-2:] == ["from A 3", "ok"]
        assert len(other.chats()) == 2


# ---- a file that cannot be written (locked by another program, read-only, disk full) ------------
def test_a_locked_database_is_a_one_line_store_error_not_a_crash(tmp_path: Path) -> None:
    from app.store import StoreError

    store = ChatStore.open(tmp_path / "s.db")
    cid = store.new_chat("locked")
    store._db.execute("PRAGMA busy_timeout = 100")  # (5 s in the app)
    other = __import__("sqlite3").connect(tmp_path / "s.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another program holds the write lock
    try:
        with pytest.raises(StoreError, match="database is locked"):
            store.add_message(cid, "user", "hello")
        assert [c.title for c in store.chats()] == ["locked"]  # reading goes on (WAL)
    finally:
        other.execute("ROLLBACK")
    store.add_message(cid, "user", "hello")
    assert [m.content for m in store.messages(cid)] == ["hello"]


async def test_a_delete_or_rename_the_file_refuses_says_so_and_changes_nothing(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A delete the file refused still said "Chat deleted." and closed the chat (which stayed in the
    list and the file); a refused rename left the new title on the title line."""
    from app.store import StoreError

    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "first")

        def refuse(*args: object, **kwargs: object) -> None:
            raise StoreError("could not save: database is locked", path=str(data_dir / DB_NAME))

        monkeypatch.setattr(app.chat.store, "rename_chat", refuse)
        monkeypatch.setattr(app.chat.store, "delete_chat", refuse)
        await pilot.press("ctrl+l", "r", "ctrl+u", *"New name", "enter")
        await pilot.pause()
        assert app.chat.chat_title == "first" and "New name" not in screen_text(app)
        assert any("database is locked" in m and s == "error" for m, s in notices(app))
        app._notifications.clear()
        await pilot.press("delete", "delete")
        await pilot.pause()
        assert not any(m == "Chat deleted." for m, _ in notices(app))
        assert any("database is locked" in m and s == "error" for m, s in notices(app))
        assert app.chat.chat_id is not None and [m["content"] for m in app.chat.conversation] == ["first", "ok"]
        assert [c.title for c in app.chat.chat_list.chats] == ["first"]


def test_saving_into_a_chat_deleted_elsewhere_says_so(tmp_path: Path) -> None:
    """Another window deleted the chat this one shows: each save failed with "could not save:
    FOREIGN KEY constraint failed"."""
    from app.store import StoreError

    store = ChatStore.open(tmp_path / "s.db")
    cid = store.new_chat("shared")
    store.add_message(cid, "user", "hello")
    other = ChatStore.open(tmp_path / "s.db")
    other.delete_chat(cid)
    with pytest.raises(StoreError, match="this chat was deleted \\(in another specchat window\\?\\)") as e:
        store.add_message(cid, "assistant", "hi")
    assert "FOREIGN KEY" not in str(e.value) and "Ctrl+N" in str(e.value)
    assert other.chats() == [] and store.chats() == []
