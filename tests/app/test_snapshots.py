"""SVG snapshots of the main screens (pytest-textual-snapshot's ``snap_compare``; issue 5).

Every snapshot is pinned so it comes out the same on every run and machine: fake engines with fixed
``ms`` per step (fixed tok/s), a fixed memory reading and no GPU, the chat store in a tmp data dir
with HOME pointing next to it (the help screen prints the store's path as ``~/…``), a fake Hub that
holds the transfer at a fixed byte, a fixed download rate, and the text cursors not blinking.
Each test also checks the screen's text before the snapshot is taken, so a loading or blank screen
could never be accepted as the snapshot.

    pytest tests/app/test_snapshots.py --snapshot-update   # rewrite the SVGs in __snapshots__/
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, ProgressBar, TextArea

from app.main import SpecChatApp
from app.screens import HelpScreen, ModelsScreen
from app.sysinfo import GpuReading, MemoryMonitor, MemoryReading
from app.store import DB_NAME, ChatStore
from app.widgets import DraftTreeView
from app.widgets.download import DownloadPanel
from engine import hub
from engine.events import StepEvent

from ..fakehub import FakeHub, write_models_file
from .fakes import ScriptedEngine, tree_step
from .test_chat import make_app, screen_text, send, wait_for
from .test_models_screen import MODELS_TOML, Loader, engine_named, open_picker, pick

SMALL = (80, 24)
WIDE = (140, 45)
PICKER = (100, 30)
MEMORY = MemoryReading(rss_mb=512.0, ram_used_mb=6144.0, ram_total_mb=16384.0)
RATE = 50_000.0  # bytes/s shown in the download panel
WEIGHTS = bytes(range(256)) * 1563  # 400,128 bytes: "400.1 kB"
HOLD_AT = 100_000  # the fake Hub pauses model.safetensors here

Snap = Callable[..., bool]
RunBefore = Callable[[Pilot], Awaitable[None]]


class NoGpu:
    available = False

    def read(self) -> list[GpuReading]:
        return []


@pytest.fixture(autouse=True)
def pinned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Machine-dependent readings made constant: memory, GPU, HOME (paths shown as ~/…), download rate."""
    monkeypatch.setattr("app.sysinfo.GpuProbe", NoGpu)
    monkeypatch.setattr(MemoryMonitor, "read", lambda self: MEMORY)
    monkeypatch.setenv("HOME", str(tmp_path))
    real_format_rate = hub.format_rate

    def fixed_rate(p: hub.Progress) -> str:  # the real formatter, fed a fixed rate and its ETA
        eta = (p.total - p.done) / RATE
        return real_format_rate(dataclasses.replace(p, rate=RATE, eta_s=eta))

    monkeypatch.setattr("app.widgets.download.format_rate", fixed_rate)


# ---- helpers ------------------------------------------------------------------------------------
def no_blink(app: SpecChatApp) -> None:
    """Text cursors stay on (a blinking one would be on or off depending on when the shot is taken)."""
    for screen in app.screen_stack:
        for widget in screen.query(TextArea):
            widget.cursor_blink = False
        for widget in screen.query(Input):
            widget.cursor_blink = False


async def loaded(pilot: Pilot) -> SpecChatApp:
    app = pilot.app
    assert isinstance(app, SpecChatApp)
    await wait_for(pilot, lambda: app.session is not None)
    await pilot.pause()
    return app


def snapshot(snap_compare: Snap, app: SpecChatApp, size: tuple[int, int], run_before: RunBefore,
             expected: list[str], after_shot: Callable[[], None] | None = None) -> None:
    """Run ``run_before``, check the screen shows ``expected``, then compare the SVG snapshot.

    ``after_shot`` runs once the screenshot is taken (snap_compare then exits the app): it unblocks
    whatever the test held still, so the app's thread workers end and the exit does not wait for them.
    """
    seen: dict[str, str] = {}
    if after_shot is not None:
        exit_app = app.exit

        def release_then_exit(*args: Any, **kwargs: Any) -> None:
            after_shot()
            exit_app(*args, **kwargs)

        app.exit = release_then_exit  # type: ignore[method-assign]

    async def before(pilot: Pilot) -> None:
        await run_before(pilot)
        no_blink(app)
        await pilot.pause()
        seen["text"] = screen_text(app)

    matched = snap_compare(app, terminal_size=size, run_before=before)
    text = seen.get("text", "")  # empty if run_before failed (its error is in the output above)
    missing = [s for s in expected if s not in text]
    assert not missing, f"not on the screen: {missing}\n{text}"
    assert matched, "the screen differs from the stored snapshot (see snapshot_report.html)"


def script() -> list[StepEvent]:
    """Five steps with draft trees (10 ms each: fixed tok/s), one of them plain decoding."""
    plain = StepEvent(step=3, strategy="ar greedy", drafted=0, accepted=0, emitted=[7], text=" Sure",
                      segments=[(" Sure", "target")], ms=10.0)
    return [
        tree_step(1, ["The", "A"], [-1, -1], [0], " cat"),
        tree_step(2, [" sat", " ran", " on"], [-1, -1, 0], [0, 2], " the"),
        plain,
        tree_step(4, [" mat", " rug", " and", " purred"], [-1, -1, 0, 2], [0, 2, 3], "."),
        tree_step(5, [" It", " The"], [-1, -1], [], " Then"),
    ]


# ---- (a) the chat, idle, with a restored chat ------------------------------------------------------
def test_chat_idle_with_a_restored_chat_80x24(snap_compare: Snap, data_dir: Path) -> None:
    store = ChatStore.open(data_dir / DB_NAME)
    chat = store.new_chat(model="FakeLM-1M (test) <- drafter: FakeDraft-100k")  # (what it runs: no "last ran" notice)
    store.add_message(chat, "user", "What is speculative decoding?")
    store.add_message(chat, "assistant", "A small model drafts tokens; the big one **verifies** them in one pass.",
                      {"tokens": 14, "finish_reason": "eos"})
    store.close()
    app = make_app(ScriptedEngine(script()))

    async def run_before(pilot: Pilot) -> None:
        await loaded(pilot)
        await wait_for(pilot, lambda: "verifies" in screen_text(app))

    snapshot(snap_compare, app, SMALL, run_before, [
        "What is speculative decoding?", "the big one verifies them", "FakeLM-1M", "ready"])


# ---- (b) mid-reply, dashboard visible -----------------------------------------------------------------
def test_mid_reply_with_the_dashboard_140x45(snap_compare: Snap) -> None:
    gate = threading.Semaphore(0)
    app = make_app(ScriptedEngine(script(), gate=gate))

    async def run_before(pilot: Pilot) -> None:
        await loaded(pilot)
        await send(pilot, "Tell me about the cat.")
        for _ in range(4):  # steps 1-4 of 5: the engine then waits for the gate, mid-reply
            gate.release()
        painted = ("The cat sat on the Sure mat and purred.", "step 4 · drafted 4, accepted 3 · latest", "generating…")
        await wait_for(pilot, lambda: all(s in screen_text(app) for s in painted))  # reply, dashboard, status
        assert app.chat.busy

    def let_it_finish() -> None:
        for _ in range(5):
            gate.release()

    try:
        snapshot(snap_compare, app, WIDE, run_before, [
            "The cat sat on the Sure mat and purred.", "generating…", "step 4: drafted 4, accepted 3",
            "tok/s now 250.0 · avg 250.0", "RSS 512 MiB · RAM 6.0/16.0 GiB (38%)",
            "✓ ' purred'", "→ '.' (target)", "step 4 · drafted 4, accepted 3 · latest"], after_shot=let_it_finish)
    finally:
        let_it_finish()  # whatever happened, the engine thread runs out


# ---- (c) the draft tree, focused, one step back -------------------------------------------------------
def test_draft_tree_focused_and_stepped_back_140x45(snap_compare: Snap) -> None:
    app = make_app(ScriptedEngine(script()))

    async def run_before(pilot: Pilot) -> None:
        await loaded(pilot)
        await send(pilot, "Tell me about the cat.")
        await wait_for(pilot, lambda: not app.chat.busy)
        tree = app.query_one(DraftTreeView)
        tree.focus()
        await pilot.press("left_square_bracket")
        assert tree.shown is not None and tree.shown.step == 4
        await pilot.pause()

    snapshot(snap_compare, app, WIDE, run_before, [
        "done · eos", "step 4 · drafted 4, accepted 3 · 4/5  (]", "newer, End latest)",
        "✓ ' mat'", "✓ ' and'", "✓ ' purred'", "  ' rug'", "→ '.' (target)"])


# ---- (d), (e) the model picker ------------------------------------------------------------------------
@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as fh:
        fh.add_repo("org/remote", {"config.json": b"{}", "model.safetensors": WEIGHTS})
        fh.add_repo("org/cached", {"config.json": b"{}", "model.safetensors": b"c" * 5000})
        fh.use(monkeypatch, tmp_path)
        hub.download("org/cached")
        yield fh


@pytest.fixture
def models_file(tmp_path: Path) -> Path:
    return write_models_file(tmp_path, MODELS_TOML)


def picker_app(models_file: Path) -> SpecChatApp:
    first = engine_named("local-model")
    return SpecChatApp(lambda: first, model_loader=Loader(), models_file=str(models_file))  # type: ignore[arg-type, return-value]


def test_model_picker_100x30(snap_compare: Snap, fake_hub: FakeHub, models_file: Path) -> None:
    app = picker_app(models_file)

    async def run_before(pilot: Pilot) -> None:
        await loaded(pilot)
        await open_picker(pilot)

    snapshot(snap_compare, app, PICKER, run_before, [
        "Models", "local-model", "loaded", "cached-model", "cached", "5.0 kB", "remote-model", "not downloaded",
        "~400.0 kB", "gated-model", "drafts for: remote-model", "…or a Hub id"])


def test_model_picker_download_in_progress_100x30(snap_compare: Snap, fake_hub: FakeHub, models_file: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "PROGRESS_INTERVAL_S", 0.0)  # every chunk is reported: the last one shows HOLD_AT
    fake_hub.hold_after = HOLD_AT
    app = picker_app(models_file)

    async def run_before(pilot: Pilot) -> None:
        await loaded(pilot)
        screen = await open_picker(pilot)
        await pick(pilot, screen, "remote-model")
        bar = screen.query_one("#download-file-bar")
        await wait_for(pilot, lambda: fake_hub.held.is_set() and bar.progress == HOLD_AT)  # type: ignore[attr-defined]
        await pilot.pause()
        assert screen.query_one(DownloadPanel).active
        # Textual rounds a bar's fill to its width when the value is set, but not while the bar has
        # no size yet: reports that beat the panel's first layout would leave an unrounded fill.
        # Set the fill again now that the bars are laid out, so the shot never depends on that race.
        for progress_bar in screen.query(ProgressBar):
            inner = progress_bar.query_one("#bar")
            assert inner.size.width == 20
            inner.percentage = progress_bar.percentage  # type: ignore[attr-defined]
        await pilot.pause()

    def cancel_and_release() -> None:
        screen = app.screen
        if isinstance(screen, ModelsScreen) and screen.job is not None:
            screen.job.cancel.set()  # the worker stops at its next chunk instead of finishing the download
        fake_hub.release.set()

    try:
        snapshot(snap_compare, app, PICKER, run_before, [
            "Downloading org/remote · file 2/2", "model.safetensors 100.0 kB / 400.1 kB",
            "total 100.0 kB / 400.1 kB · 50.0 kB/s · ETA 6s", "25%", "Cancel (Esc)", "Esc: cancel the download"],
            after_shot=cancel_and_release)
    finally:
        fake_hub.release.set()


# ---- (f) help ----------------------------------------------------------------------------------------
def test_help_screen_80x24(snap_compare: Snap) -> None:
    app = make_app(ScriptedEngine(script()))

    async def run_before(pilot: Pilot) -> None:
        await loaded(pilot)
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause()

    snapshot(snap_compare, app, SMALL, run_before, [
        "Keys", "Ctrl+O", "models: pick, download", "send the message", "Esc closes"])

