"""Review (session 42) of the chat search with many chats and of cancelling a stalled download.

Search: with 1,000 chats each keystroke in the search box cost ~200 ms (a store query, then every
row rebuilt and measured again), so typing lagged. A long list is now searched once typing pauses,
kept rows are reused and the same listing is not rebuilt.

Downloads: Esc (cancel) or quitting while the server had stopped sending mid-file waited out the
read timeout (HF_HUB_DOWNLOAD_TIMEOUT, 10 s; 30 s here, so that a pass cannot be the timeout's).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual import events
from textual.widgets import OptionList

from app.main import SpecChatApp
from app.store import DB_NAME, ChatStore
from app.widgets.chat_list import ChatList
from app.widgets.download import DownloadPanel
from engine import hub

from ..fakehub import FakeHub
from .fakes import FakeEngine
from .test_chat import make_app, ready, wait_for
from .test_models_screen import WEIGHTS, Loader, fake, models_file, notices, open_picker, pick, status_cell
from .test_models_screen import make_app as make_picker_app

__all__ = ["fake", "models_file"]  # fixtures, from test_models_screen

CHATS = 1000
PROMPT_S = 2.0  # a cancel takes effect within this (it takes ~0.1 s; the margin is for a loaded machine)


# ---- search ------------------------------------------------------------------------------------
def seed_chats(data_dir: Path, n: int = CHATS) -> None:
    """``n`` chats titled "chat 0" … "chat n-1" ("chat n-1" the newest), two messages each."""
    store = ChatStore.open(data_dir / DB_NAME)
    db = store._db
    db.execute("BEGIN")
    for i in range(n):
        cid = db.execute("INSERT INTO chats (title, created, updated) VALUES (?, '', ?)",
                         (f"chat {i}", f"2026-01-01T00:00:{i:06d}")).lastrowid
        db.execute("INSERT INTO messages VALUES (?, 0, 'user', ?, '', NULL)", (cid, f"question {i}"))
        db.execute("INSERT INTO messages VALUES (?, 1, 'assistant', ?, '', NULL)", (cid, f"answer {i}"))
    db.execute("COMMIT")
    store.close()


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[object]]:
    """Records every search the store runs and every time the chat list's OptionList is rebuilt."""
    seen: dict[str, list[object]] = {"searches": [], "rebuilds": []}
    chats, set_options = ChatStore.chats, OptionList.set_options

    def counting_chats(self: ChatStore, search: str = "") -> object:
        seen["searches"].append(search)
        return chats(self, search)

    def counting_set_options(self: OptionList, options: object) -> object:
        if self.id == "chat-options":
            seen["rebuilds"].append(self)
        return set_options(self, options)

    monkeypatch.setattr(ChatStore, "chats", counting_chats)
    monkeypatch.setattr(OptionList, "set_options", counting_set_options)
    return seen


def type_fast(app: SpecChatApp, text: str) -> None:
    """Keys as fast as a paste: every key is queued before the app handles the first."""
    for ch in text:
        app.post_message(events.Key("space" if ch == " " else ch, ch))


async def open_search(pilot: object, app: SpecChatApp) -> ChatList:
    await ready(pilot)  # type: ignore[arg-type]
    await pilot.press("ctrl+l", "slash")  # type: ignore[attr-defined]
    await pilot.pause()  # type: ignore[attr-defined]
    listing = app.query_one(ChatList)
    assert listing.options.option_count == CHATS + 1 and listing.query_one("#chat-search").has_focus
    return listing


async def test_typing_fast_in_a_long_list_searches_once_typing_pauses(data_dir: Path, counted: dict[str, list[object]]) -> None:
    seed_chats(data_dir)
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=(100, 30)) as pilot:
        listing = await open_search(pilot, app)
        first_rows = [listing.options.get_option_at_index(i) for i in range(listing.options.option_count)]
        counted["searches"].clear()
        counted["rebuilds"].clear()
        type_fast(app, "chat 99")
        await wait_for(pilot, lambda: [c.title for c in listing.chats] == ["chat 999", "chat 998", "chat 997", "chat 996", "chat 995",
                                                                           "chat 994", "chat 993", "chat 992", "chat 991", "chat 990", "chat 99"])
        await pilot.pause(0.3)  # (twice SEARCH_PAUSE_S) nothing more comes: the last search was the whole text
        # one search and one rebuild for 7 keys (3 at most: a machine too loaded to handle 7 keys in 150 ms)
        assert 1 <= len(counted["searches"]) <= 3 and counted["searches"][-1] == "chat 99", counted["searches"]
        assert 1 <= len(counted["rebuilds"]) <= 3
        assert listing.options.option_count == 12

        await pilot.press("escape")  # clears the search: every chat, in the rows measured at the first listing
        await wait_for(pilot, lambda: listing.options.option_count == CHATS + 1)
        again = [listing.options.get_option_at_index(i) for i in range(CHATS + 1)]
        assert all(a is b for a, b in zip(again, first_rows))
        rebuilds = len(counted["rebuilds"])
        listing.show_chats(list(listing.chats), app.chat.chat_id)  # the same listing: not rebuilt
        assert len(counted["rebuilds"]) == rebuilds and listing.options.option_count == CHATS + 1


async def test_enter_right_after_typing_lists_what_was_typed_before_the_list_takes_the_keys(
        data_dir: Path, counted: dict[str, list[object]]) -> None:
    """Enter does not wait for typing to pause: it searches at once, and the list takes the focus
    only once it shows that search (an Enter there then opens a chat the search found)."""
    seed_chats(data_dir)
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=(100, 30)) as pilot:
        listing = await open_search(pilot, app)
        counted["searches"].clear()
        type_fast(app, "chat 500")
        app.post_message(events.Key("enter", "\r"))
        await pilot.pause()  # (less than SEARCH_PAUSE_S: the timer would not have fired yet)
        assert [c.title for c in listing.chats] == ["chat 500"] and counted["searches"] == ["chat 500"]
        assert listing.options.has_focus
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: not listing.display)
        assert app.chat.conversation[0]["content"] == "question 500"


async def test_a_short_list_is_still_searched_at_every_keystroke(data_dir: Path, counted: dict[str, list[object]]) -> None:
    seed_chats(data_dir, 20)
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+l", "slash")
        await pilot.pause()
        counted["searches"].clear()
        await pilot.press("1")
        await pilot.pause()  # no pause to wait out
        assert counted["searches"] == ["1"] and len(app.query_one(ChatList).chats) == 11  # chat 1, 10…19


# ---- a download the server stalls ------------------------------------------------------------------
@pytest.fixture
def stalled(fake: FakeHub, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The fake Hub sends 100 kB of org/remote's weights, then nothing until released (or closed)."""
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "30")
    fake.hold_after = 100_000
    yield fake
    fake.release.set()


@pytest.fixture
def download_ends(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """time.monotonic() of every return (or raise) of hub.download, whichever thread runs it."""
    ends: list[float] = []
    download = hub.download

    def timed(*args: object, **kwargs: object) -> object:
        try:
            return download(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            ends.append(time.monotonic())

    monkeypatch.setattr(hub, "download", timed)
    return ends


async def test_escape_during_a_stalled_download_cancels_at_once(stalled: FakeHub, models_file: Path, download_ends: list[float]) -> None:
    loader = Loader()
    app = make_picker_app(models_file, loader)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        screen = await open_picker(pilot)
        await pick(pilot, screen, "remote-model")
        await wait_for(pilot, stalled.held.is_set)
        await wait_for(pilot, lambda: hub.has_partial("org/remote"))
        await pilot.pause(0.2)  # the worker is blocked in its read now
        asked = time.monotonic()
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.job is None, timeout=PROMPT_S + 5)
        assert download_ends and download_ends[-1] - asked < PROMPT_S
        await pilot.pause()
        assert any("cancelled" in m and "resume" in m and sev == "warning" for m, sev in notices(app))
        assert app.screen is screen and not screen.query_one(DownloadPanel).active
        assert status_cell(screen, "remote-model") == "partial" and loader.calls == []
        assert hub.cached_snapshot("org/remote") is None  # the partial file is not a model


async def test_quitting_during_a_stalled_download_does_not_wait_for_the_server(
        stalled: FakeHub, models_file: Path, download_ends: list[float], tmp_path: Path) -> None:
    """The download's thread held the process after the app quit (Python joins it at exit)."""
    loader = Loader()
    app = make_picker_app(models_file, loader)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_picker(pilot)
        await pick(pilot, screen, "remote-model")
        await wait_for(pilot, stalled.held.is_set)
        await pilot.pause(0.2)
        asked = time.monotonic()
        await pilot.press("ctrl+q")
    deadline = time.monotonic() + PROMPT_S + 5
    while not download_ends and time.monotonic() < deadline:
        time.sleep(0.01)
    assert download_ends and download_ends[-1] - asked < PROMPT_S
    assert not [t for t in threading.enumerate() if t.name == "specchat-download-cancel"]
    assert hub.cached_snapshot("org/remote") is None and hub.has_partial("org/remote")
    stalled.release.set()
    stalled.hold_after = None
    snap = hub.download("org/remote")  # the partial file resumes
    assert (snap / "model.safetensors").read_bytes() == WEIGHTS
