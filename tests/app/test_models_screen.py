"""Ctrl+O, the model picker: availability, downloads with progress bars, cancel, error toasts, switching.

Downloads go to a local fake Hub (tests/fakehub.py) and a cache in tmp_path; sessions are FakeEngines.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Label, ProgressBar

from app.main import SpecChatApp
from app.screens import ChatScreen, ModelsScreen
from app.screens.models import drafter_after_switch, model_rows, pairing_notes
from app.widgets.download import DownloadPanel
from app.widgets.prompt import PromptInput
from engine import hub
from engine.registry import load_registry

from ..fakehub import FakeHub, write_models_file
from .fakes import FakeEngine

SIZE = (100, 30)
WEIGHTS = os.urandom(400_000)
MODELS_TOML = """
[[model]]
name = "local-model"
local = "local.gguf"
role = ["target", "drafter"]
params = "1M"

[[model]]
name = "cached-model"
hub_id = "org/cached"
role = ["target"]

[[model]]
name = "remote-model"
hub_id = "org/remote"
role = ["target"]
params = "2M"
size_mb = 0.4

[[model]]
name = "gated-model"
hub_id = "org/gated"
role = ["target"]

[[pairing]]
target = "remote-model"
drafter = "local-model"
vocab = "same"
default = true
"""


class Loader:
    """A ModelLoader that records its calls and returns FakeEngines (or raises for ``fail``)."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail = fail

    def __call__(self, target: str, drafter: str) -> FakeEngine:
        self.calls.append((target, drafter))
        if target == self.fail:
            raise RuntimeError(f"{target}: weights are corrupt\n(details)")
        return engine_named(target, None if drafter == "none" else drafter)


def engine_named(target: str, drafter: str | None = None) -> FakeEngine:
    engine = FakeEngine(["Hi", "!"], description=f"{target} (fake)", has_drafter=drafter is not None)
    engine.target = SimpleNamespace(name=target)  # type: ignore[attr-defined]
    engine.drafter = SimpleNamespace(name=drafter) if drafter else None  # type: ignore[attr-defined]
    return engine


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as fh:
        fh.add_repo("org/remote", {"config.json": b"{}", "model.safetensors": WEIGHTS})
        fh.add_repo("org/cached", {"config.json": b"{}", "model.safetensors": b"c" * 5000})
        fh.add_repo("org/free", {"config.json": b"{}", "model.safetensors": b"f" * 3000})
        fh.add_repo("org/gated", {"config.json": b"{}", "model.safetensors": b"g" * 3000}, gated=True)
        fh.use(monkeypatch, tmp_path)
        hub.download("org/cached")
        # the server thread books the bytes after the client has them: let it finish before clearing
        deadline = time.monotonic() + 5
        while fh.bytes_sent.get("org/cached/model.safetensors", 0) < 5000 and time.monotonic() < deadline:
            time.sleep(0.01)
        fh.requests.clear()
        fh.bytes_sent.clear()
        yield fh


@pytest.fixture
def models_file(tmp_path: Path) -> Path:
    return write_models_file(tmp_path, MODELS_TOML)


def make_app(models_file: Path, loader: Loader, engine: FakeEngine | None = None) -> SpecChatApp:
    first = engine or engine_named("local-model")
    return SpecChatApp(lambda: first, model_loader=loader, models_file=str(models_file))  # type: ignore[arg-type, return-value]


# ---- helpers ------------------------------------------------------------------------------------
async def wait_for(pilot: Pilot, condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {condition}")
        await pilot.pause(0.01)


async def open_picker(pilot: Pilot) -> ModelsScreen:
    app = pilot.app
    assert isinstance(app, SpecChatApp)
    await wait_for(pilot, lambda: app.session is not None)
    await pilot.press("ctrl+o")
    await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
    await pilot.pause()
    assert isinstance(app.screen, ModelsScreen)
    return app.screen


async def pick(pilot: Pilot, screen: ModelsScreen, name: str) -> None:
    """Move the table's cursor to ``name`` and press Enter."""
    table = screen.query_one(DataTable)
    table.focus()
    table.move_cursor(row=list(screen.rows).index(name))
    await pilot.pause()
    await pilot.press("enter")


def notices(app: SpecChatApp) -> list[tuple[str, str]]:
    return [(f"{n.title} {n.message}", n.severity) for n in app._notifications]


def status_cell(screen: ModelsScreen, name: str) -> str:
    return str(screen.query_one(DataTable).get_row(name)[2])


def bar(screen: ModelsScreen, which: str) -> ProgressBar:
    return screen.query_one(f"#download-{which}-bar", ProgressBar)


def label(screen: ModelsScreen, which: str) -> str:
    return str(screen.query_one(f"#download-{which}", Label).content)


# ---- the rows, without a screen ----------------------------------------------------------------------
def test_rows_show_availability_size_and_pairings(fake: FakeHub, models_file: Path) -> None:
    reg = load_registry(models_file)
    rows = {r.name: r for r in model_rows(reg, current_target="cached-model")}
    assert {n: r.status for n, r in rows.items()} == {"local-model": "local", "cached-model": "loaded",
                                                     "remote-model": "not downloaded", "gated-model": "not downloaded"}
    assert rows["cached-model"].size == hub.format_bytes(5002) and rows["remote-model"].size == "~400.0 kB"
    assert rows["local-model"].size == "104 B" and rows["gated-model"].size == "?"
    assert pairing_notes(reg, "remote-model") == "drafters: local-model (same)"
    assert pairing_notes(reg, "local-model") == "drafts for: remote-model"
    assert pairing_notes(reg, "cached-model") == ""
    assert drafter_after_switch(reg, "remote-model", "local-model") == "local-model"
    assert drafter_after_switch(reg, "cached-model", "local-model") == "none"
    # no drafter now (or one not paired): the target's default pairing's, as at start-up, if on disk
    assert drafter_after_switch(reg, "remote-model", None) == "local-model"
    assert drafter_after_switch(reg, "remote-model", None, available=lambda name: False) == "none"
    assert drafter_after_switch(reg, "gated-model", None) == "none"  # no pairing


# ---- the picker ----------------------------------------------------------------------------------------
async def test_picker_lists_entries_with_availability_and_closes(fake: FakeHub, models_file: Path) -> None:
    app = make_app(models_file, Loader())
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot)
        assert list(screen.rows) == ["local-model", "cached-model", "remote-model", "gated-model"]
        assert [status_cell(screen, n) for n in screen.rows] == ["loaded", "cached", "not downloaded", "not downloaded"]
        detail = str(screen.query_one("#models-detail").render())
        assert "drafts for: remote-model" in detail  # the cursor starts on the loaded model
        screen.query_one(DataTable).move_cursor(row=2)
        await pilot.pause()
        detail = str(screen.query_one("#models-detail").render())
        assert "org/remote" in detail and "drafters: local-model (same)" in detail
        assert not screen.query_one(DownloadPanel).active
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))


async def test_a_narrow_picker_shows_parameters_and_status_before_the_role(fake: FakeHub, models_file: Path) -> None:
    """At 60 columns the table scrolls sideways: name, parameters and status stay in view (the
    parameter count used to be the fourth column, cut off there), the role is what scrolls."""
    app = make_app(models_file, Loader())
    async with app.run_test(size=(60, 24)) as pilot:
        screen = await open_picker(pilot)
        table = screen.query_one(DataTable)
        await pilot.pause()
        cols = list(table.columns.values())
        assert [str(c.label) for c in cols][:3] == ["model", "params", "status"]
        end = sum(c.get_render_width(table) for c in cols[:3])  # the status column's right edge
        assert end <= table.scrollable_content_region.width, (end, table.scrollable_content_region.width)


async def test_download_shows_progress_bars_then_switches_keeping_a_paired_drafter(fake: FakeHub, models_file: Path) -> None:
    fake.delay_s, fake.chunk = 0.02, 8192
    loader = Loader()
    app = make_app(models_file, loader, engine_named("local-model", drafter="local-model"))
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot)
        await pick(pilot, screen, "remote-model")
        panel = screen.query_one(DownloadPanel)
        assert panel.active and not screen.query_one(Input).display
        await wait_for(pilot, lambda: 0 < (bar(screen, "file").progress or 0) < len(WEIGHTS))
        assert bar(screen, "file").total == len(WEIGHTS)
        assert bar(screen, "total").total == len(WEIGHTS) + 2 and bar(screen, "total").progress >= bar(screen, "file").progress
        assert label(screen, "file").startswith("model.safetensors ") and "/ 400.0 kB" in label(screen, "file")
        assert label(screen, "total").startswith("total ") and "/ 400.0 kB" in label(screen, "total")
        assert "file 2/2" in label(screen, "title")
        await wait_for(pilot, lambda: loader.calls and app.session is not None and "remote-model" in app.session.description)
        assert loader.calls == [("remote-model", "local-model")]  # the pairing keeps the drafter
        assert isinstance(app.screen, ChatScreen)
        assert any("Downloaded org/remote" in m for m, _ in notices(app))
        snap = hub.cached_snapshot("org/remote")
        assert snap is not None and (snap / "model.safetensors").read_bytes() == WEIGHTS


@pytest.mark.parametrize("how", ["escape", "button"])
async def test_cancel_keeps_the_partial_file_and_the_picker_open(fake: FakeHub, models_file: Path, how: str) -> None:
    fake.delay_s, fake.chunk = 0.02, 4096
    loader = Loader()
    app = make_app(models_file, loader)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot)
        first = app.session
        await pick(pilot, screen, "remote-model")
        await wait_for(pilot, lambda: (bar(screen, "file").progress or 0) > 8192 and bar(screen, "file").total == len(WEIGHTS))
        if how == "escape":
            await pilot.press("escape")
        else:
            await pilot.click("#download-cancel")
        await wait_for(pilot, lambda: screen.job is None)
        await pilot.pause()
        assert any("cancelled" in m and "resume" in m and sev == "warning" for m, sev in notices(app))
        assert app.screen is screen and not screen.query_one(DownloadPanel).active
        assert status_cell(screen, "remote-model") == "partial" and hub.has_partial("org/remote")
        assert loader.calls == [] and app.session is first
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))


async def test_errors_are_toasts_and_the_app_stays_usable(fake: FakeHub, models_file: Path) -> None:
    loader = Loader()
    engine = engine_named("local-model")
    app = make_app(models_file, loader, engine)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot)
        await pick(pilot, screen, "gated-model")
        await wait_for(pilot, lambda: any("gated" in m and sev == "error" for m, sev in notices(app)))
        await wait_for(pilot, lambda: screen.job is None)
        hub_id = screen.query_one(Input)
        assert app.screen is screen and hub_id.display and not screen.query_one(DownloadPanel).active

        for ref, message in (("org/nope", "no such model on the Hub"), ("not a repo", "is not a Hub id")):
            hub_id.focus()
            hub_id.value = ref
            await pilot.press("enter")
            await wait_for(pilot, lambda: any(message in m and sev == "error" for m, sev in notices(app)))
        await wait_for(pilot, lambda: screen.job is None)
        assert loader.calls == [] and fake.bytes_sent == {}

        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        prompt = app.query_one(PromptInput)
        prompt.text = "still there?"
        await pilot.press("enter")
        await wait_for(pilot, lambda: engine.calls and not app.chat.busy)
        assert engine.calls[-1][-1] == {"role": "user", "content": "still there?"}


async def test_picking_an_available_model_switches_without_downloading(fake: FakeHub, models_file: Path) -> None:
    loader = Loader()
    app = make_app(models_file, loader, engine_named("local-model", drafter="local-model"))
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot)
        await pick(pilot, screen, "cached-model")
        await wait_for(pilot, lambda: app.session is not None and "cached-model" in app.session.description)
        assert loader.calls == [("cached-model", "none")]  # not paired with the current drafter: none
        assert fake.file_requests() == []


class GatedLoader(Loader):
    """A Loader that waits for ``release`` before returning (a model still loading)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def __call__(self, target: str, drafter: str) -> FakeEngine:
        self.release.wait(10)
        return super().__call__(target, drafter)


async def test_no_message_is_sent_while_a_picked_model_loads(fake: FakeHub, models_file: Path) -> None:
    """A reply started during a switch would get the new model attached in the middle of it (and
    be saved under its name): sends are refused, the text kept, until the new model is ready."""
    loader = GatedLoader()
    first = engine_named("local-model")
    app = make_app(models_file, loader, first)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot)
        await pick(pilot, screen, "cached-model")
        await wait_for(pilot, lambda: app.switching_to is not None and isinstance(app.screen, ChatScreen))
        prompt = app.query_one(PromptInput)
        prompt.focus()
        prompt.text = "are you there?"
        await pilot.press("enter")
        await pilot.pause()
        assert first.calls == [] and not app.chat.busy and prompt.text == "are you there?"
        assert any("Loading cached-model" in m and sev == "warning" for m, sev in notices(app))
        loader.release.set()
        await wait_for(pilot, lambda: app.switching_to is None and "cached-model" in app.session.description)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.session.calls and not app.chat.busy)
        assert first.calls == [] and app.session.calls[-1][-1] == {"role": "user", "content": "are you there?"}


async def test_a_free_hub_id_downloads_and_loads(fake: FakeHub, models_file: Path) -> None:
    loader = Loader()
    app = make_app(models_file, loader)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot)
        hub_id = screen.query_one(Input)
        hub_id.focus()
        hub_id.value = "org/free"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.session is not None and "org/free" in app.session.description)
        assert loader.calls == [("org/free", "none")]
        assert hub.cached_snapshot("org/free") is not None


async def test_a_failed_switch_keeps_the_current_model(fake: FakeHub, models_file: Path) -> None:
    loader = Loader(fail="cached-model")
    engine = engine_named("local-model")
    app = make_app(models_file, loader, engine)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot)
        await pick(pilot, screen, "cached-model")
        await wait_for(pilot, lambda: any("Could not load cached-model" in m for m, _ in notices(app)))
        assert app.session is engine and app.load_error is None
        message = next(m for m, _ in notices(app) if "Could not load" in m)
        assert "weights are corrupt" in message and "(details)" not in message and "still using local-model" in message


async def test_help_lists_ctrl_o(fake: FakeHub, models_file: Path) -> None:
    app = make_app(models_file, Loader())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        await pilot.press("f1")
        await pilot.pause()
        text = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
        assert "Ctrl+O" in text and "models" in text


async def test_switching_back_to_a_target_brings_its_paired_drafter_back(fake: FakeHub, models_file: Path) -> None:
    """A switch to a target whose default pairing's drafter is on disk loads that drafter too, as
    start-up does: switching away (to a target it does not pair with) and back left the target
    without its drafter, and the app then advised a picker that could not bring it back."""
    loader = Loader()
    app = make_app(models_file, loader, engine_named("cached-model"))  # no drafter now
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot)
        screen.query_one(DataTable).move_cursor(row=list(screen.rows).index("remote-model"))
        await pilot.pause()
        assert "loads with its drafter local-model" in str(screen.query_one("#models-detail").render())
        await pick(pilot, screen, "remote-model")  # downloads it, then loads it with its drafter
        await wait_for(pilot, lambda: loader.calls and app.session is not None and "remote-model" in app.session.description)
        assert loader.calls == [("remote-model", "local-model")]
