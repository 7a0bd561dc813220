"""Ctrl+O, the model picker: availability, downloads with progress bars, cancel, error toasts, switching.

Downloads go to a local fake Hub (tests/fakehub.py) and a cache in tmp_path; sessions are FakeEngines.
"""

from __future__ import annotations

import gc
import os
import shutil
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


PAIRED = {"remote-model": "local-model"}  # MODELS_TOML's default pairings


class Loader:
    """A ModelLoader that records its calls and returns FakeEngines (or raises for ``fail``).
    A drafter None is the target's default pairing's, as ChatSession.load picks it."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self.fail = fail

    def __call__(self, target: str, drafter: str | None) -> FakeEngine:
        self.calls.append((target, drafter))
        if target == self.fail:
            raise RuntimeError(f"{target}: weights are corrupt\n(details)")
        drafter = PAIRED.get(target, "none") if drafter is None else drafter
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
        # the pairing keeps the drafter: the default pairing's, passed as None to load it as at start-up
        assert loader.calls == [("remote-model", None)] and app.session.drafter.name == "local-model"
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
        assert loader.calls == [("remote-model", None)] and app.session.drafter.name == "local-model"


# ---- overlapping loads: the last pick wins ------------------------------------------------------------
class LoaderPerTarget(Loader):
    """A Loader whose load of each of ``targets`` waits for that target's own event (loads that
    overlap and end in any order)."""

    def __init__(self, *targets: str, fail: str | None = None) -> None:
        super().__init__(fail)
        self.gates = {t: threading.Event() for t in targets}
        self.started: list[str] = []

    def __call__(self, target: str, drafter: str | None) -> FakeEngine:
        self.started.append(target)
        self.gates[target].wait(10)
        return super().__call__(target, drafter)


async def send_refused(pilot: Pilot, text: str) -> bool:
    """Enter with ``text`` in the prompt: True if no reply started and the text stayed."""
    app = pilot.app
    assert isinstance(app, SpecChatApp)
    prompt = app.query_one(PromptInput)
    prompt.focus()
    prompt.text = text
    await pilot.press("enter")
    await pilot.pause()
    return not app.chat.busy and prompt.text == text


async def test_a_pick_during_the_start_up_load_stays_when_that_load_ends_later(fake: FakeHub, models_file: Path) -> None:
    """The real model's start-up load takes seconds, and users pick another model meanwhile: the
    pick is what stays loaded (the start-up model, ending later, replaced it)."""
    startup = threading.Event()

    def factory() -> FakeEngine:
        startup.wait(10)
        return engine_named("local-model")

    loader = Loader()
    app = SpecChatApp(factory, model_loader=loader, models_file=str(models_file))  # type: ignore[arg-type]
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
        await pilot.pause()
        assert isinstance(app.screen, ModelsScreen)
        await pick(pilot, app.screen, "cached-model")
        await wait_for(pilot, lambda: app.session is not None)
        startup.set()
        await wait_for(pilot, lambda: not app.workers)
        await pilot.pause()
        assert "cached-model" in app.session.description and app.switching_to is None
        assert "cached-model" in app.chat.status_line.status.model


@pytest.mark.parametrize("first_fails", [False, True])
async def test_a_superseded_pick_ending_first_is_dropped_and_sends_wait_for_the_last(
        fake: FakeHub, models_file: Path, first_fails: bool) -> None:
    """Two picks while the first loads: when the first ends (loaded or failed), nothing changes: no
    model attached (a reply started then would have had the last pick attached in its middle), no
    error blamed on the last pick, messages still wait; the last pick loads."""
    loader = LoaderPerTarget("cached-model", "local-model", fail="cached-model" if first_fails else None)
    app = make_app(models_file, loader, engine_named("gated-model"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        first = app.session
        await pick(pilot, await open_picker(pilot), "cached-model")
        await wait_for(pilot, lambda: loader.started == ["cached-model"])
        await pick(pilot, await open_picker(pilot), "local-model")
        await wait_for(pilot, lambda: loader.started == ["cached-model", "local-model"])
        loader.gates["cached-model"].set()
        await wait_for(pilot, lambda: len(app.workers) == 1)
        await pilot.pause()
        assert app.session is first and app.switching_to is not None and app.switching_to.target == "local-model"
        assert not any("Could not load" in m for m, _ in notices(app))
        assert await send_refused(pilot, "hello?") and first.calls == []
        assert any("Loading local-model: send when it is ready" in m for m, _ in notices(app))
        loader.gates["local-model"].set()
        await wait_for(pilot, lambda: app.switching_to is None)
        assert "local-model" in app.session.description and "local-model" in app.chat.status_line.status.model


async def test_a_superseded_pick_ending_last_does_not_replace_the_last(fake: FakeHub, models_file: Path) -> None:
    loader = LoaderPerTarget("cached-model", "local-model")
    app = make_app(models_file, loader, engine_named("gated-model"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pick(pilot, await open_picker(pilot), "cached-model")
        await wait_for(pilot, lambda: loader.started == ["cached-model"])
        await pick(pilot, await open_picker(pilot), "local-model")
        await wait_for(pilot, lambda: loader.started == ["cached-model", "local-model"])
        loader.gates["local-model"].set()
        await wait_for(pilot, lambda: app.switching_to is None)
        loader.gates["cached-model"].set()
        await wait_for(pilot, lambda: not app.workers)
        await pilot.pause()
        assert "local-model" in app.session.description and "local-model" in app.chat.status_line.status.model


async def test_picking_the_model_in_use_while_another_loads_keeps_it(fake: FakeHub, models_file: Path) -> None:
    """Changing one's mind back: the load in flight is dropped (it used to say "already loaded" and
    let the other model replace it)."""
    loader = LoaderPerTarget("cached-model")
    first = engine_named("local-model")
    app = make_app(models_file, loader, first)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pick(pilot, await open_picker(pilot), "cached-model")
        await wait_for(pilot, lambda: loader.started == ["cached-model"])
        await pick(pilot, await open_picker(pilot), "local-model")
        await wait_for(pilot, lambda: app.switching_to is None and isinstance(app.screen, ChatScreen))
        assert any("Keeping local-model" in m and "cached-model is dropped" in m for m, _ in notices(app))
        loader.gates["cached-model"].set()
        await wait_for(pilot, lambda: not app.workers)
        await pilot.pause()
        assert app.session is first and loader.started == ["cached-model"]


# ---- a damaged paired drafter, external text, an unreadable cache, the strategy across a switch -------------
DAMAGED_DRAFTER_TOML = """
[[model]]
name = "other"
local = "other.gguf"
role = ["target"]

[[model]]
name = "tiny"
local = "tiny"
role = ["target"]

[[model]]
name = "drafter"
local = "drafter"
role = ["drafter"]

[[pairing]]
target = "tiny"
drafter = "drafter"
default = true
"""


async def test_a_switch_to_a_target_whose_paired_drafter_is_damaged_loads_the_target_alone(tmp_path: Path) -> None:
    """As at start-up, with the app's own loader (ChatSession.load): the target decodes alone and a
    warning says why; the switch used to fail, the picker naming the pairing's drafter as a user's
    ``--drafter`` does."""
    from ..tiny import saved

    shutil.copytree(saved("llama", str(tmp_path / "build")), tmp_path / "tiny")
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    shutil.copy(tmp_path / "tiny" / "config.json", drafter / "config.json")
    # what a checkout without `git lfs pull` leaves in place of the weights
    (drafter / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 55937694\n")
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    models = write_models_file(tmp_path, DAMAGED_DRAFTER_TOML)
    app = SpecChatApp(lambda: engine_named("other"), models_file=str(models))  # type: ignore[arg-type, return-value]
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pick(pilot, await open_picker(pilot), "tiny")
        await wait_for(pilot, lambda: app.switching_to is None, timeout=120)
        assert app.session.target.name == "tiny" and app.session.drafter is None
        assert not any("Could not load" in m for m, _ in notices(app))
        assert any("the paired drafter 'drafter' was not loaded" in m and "decoding without it" in m for m, _ in notices(app))
    gc.unfreeze()  # the app froze a real engine into the heap: freed, or nanobind reports it leaked at exit


async def test_text_from_the_user_models_toml_and_the_hub_is_shown_as_it_is(fake: FakeHub, tmp_path: Path) -> None:
    """Toasts and labels read their text as markup unless told not to: a Hub id typed with "[/]"
    crashed the app (MarkupError), as a models.toml name, a load error or a file name could."""
    fake.add_repo("org/br", {"config.json": b"{}", "tokenizer[v2].json": b"t" * 50000, "model.safetensors": b"m" * 3000})
    fake.delay_s, fake.chunk = 0.05, 4096
    models = write_models_file(tmp_path, MODELS_TOML + '\n[[model]]\nname = "odd[/]name"\nlocal = "local.gguf"\nrole = ["target"]\n')
    loader = Loader(fail="odd[/]name")
    app = make_app(models, loader)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await open_picker(pilot)
        assert "odd[/]name" in "\n".join(strip.text for strip in app.screen._compositor.render_strips())
        hub_id = screen.query_one(Input)
        hub_id.focus()
        hub_id.value = "org/x[/]"
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("'org/x[/]' is not a Hub id" in m for m, _ in notices(app)))
        hub_id.value = "org/br"
        await pilot.press("enter")
        await wait_for(pilot, lambda: "tokenizer" in label(screen, "file"))
        assert label(screen, "file").startswith("tokenizer[v2].json ")
        assert str(screen.query_one("#download-file", Label).render()).startswith("tokenizer[v2].json ")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        await wait_for(pilot, lambda: app.switching_to is None)
        await pick(pilot, await open_picker(pilot), "odd[/]name")
        await wait_for(pilot, lambda: any("Could not load odd[/]name" in m for m, _ in notices(app)))
        await pilot.pause(0.2)  # the toasts are drawn: a markup error would end the test here
        assert any("odd[/]name: weights are corrupt" in m for m, _ in notices(app))


async def test_an_unreadable_repo_folder_in_a_shared_cache_counts_as_not_downloaded(
        fake: FakeHub, models_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user's folder (mode 0700) in a shared HF cache: looking into it raises PermissionError
    (simulated: these tests run as root, whom permissions do not stop), which crashed Ctrl+O."""
    foreign = hub.default_cache_dir() / hub.repo_folder("org/remote")
    (foreign / "blobs").mkdir(parents=True)
    inside = str(foreign) + os.sep
    real_stat, real_scandir = os.stat, os.scandir

    def stat(path, *args, **kwargs):  # noqa: ANN001, ANN202 - os.stat's signature
        if os.fspath(path).startswith(inside):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_stat(path, *args, **kwargs)

    def scandir(path="."):  # noqa: ANN001, ANN202 - os.scandir's signature
        if os.fspath(path).startswith(inside) or os.fspath(path) == str(foreign):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "scandir", scandir)
    assert hub.cached_snapshot("org/remote", "0" * 40) is None and not hub.has_partial("org/remote")
    app = make_app(models_file, Loader())
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot)
        assert status_cell(screen, "remote-model") == "not downloaded"


async def test_a_strategy_picked_live_survives_a_switch(fake: FakeHub, models_file: Path) -> None:
    """``--strategy`` chose the first model's strategy; reapplied at every switch, it undid the
    strategy picked since with Ctrl+S. The pick stays where the new model can run it."""
    from engine.strategy import preset

    loader = Loader()
    app = SpecChatApp(lambda: engine_named("local-model", drafter="local-model"), model_loader=loader,  # type: ignore[arg-type, return-value]
                      models_file=str(models_file), initial_strategy=preset("tree"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        assert app.session.strategy.name == "tree"
        await pilot.press("ctrl+s")
        assert app.session.strategy.name == "mab"
        await pick(pilot, await open_picker(pilot), "remote-model")  # with its drafter
        await wait_for(pilot, lambda: app.session is not None and "remote-model" in app.session.description)
        assert app.session.strategy.name == "mab"


# ---- around a download: another screen on top, a pinned revision --------------------------------------------
async def test_a_download_ending_under_the_command_palette_does_not_close_the_palette(fake: FakeHub, models_file: Path) -> None:
    """Ctrl+P opens the command palette over the picker while it downloads; when the download
    ended, the picker's dismiss popped the top screen (the palette the user was typing in) and the
    picker stayed open below it, stale. The picker now closes itself once it is on top again."""
    from textual.command import CommandPalette

    fake.hold_after = 100_000
    loader = Loader()
    app = make_app(models_file, loader)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await open_picker(pilot)
        await pick(pilot, screen, "remote-model")
        await wait_for(pilot, fake.held.is_set)
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
        fake.release.set()
        await wait_for(pilot, lambda: any("Downloaded org/remote" in m for m, _ in notices(app)))
        await pilot.pause(0.1)
        assert [type(s) for s in app.screen_stack] == [ChatScreen, ModelsScreen, CommandPalette]
        await pilot.press("escape")  # the palette closes: the picker, done, closes and the model loads
        await wait_for(pilot, lambda: loader.calls and isinstance(app.screen, ChatScreen))
        assert loader.calls == [("remote-model", None)] and len(app.screen_stack) == 1


async def test_a_cancelled_download_of_a_pinned_revision_stays_partial_and_resumes(fake: FakeHub, tmp_path: Path) -> None:
    """An entry pinned to a commit (``revision = "<sha>"``) has no ref to mark a whole download: the
    config.json linked in the snapshot first made a cancelled download "cached", and Enter then
    loaded a model without weights instead of downloading the rest."""
    fake.delay_s, fake.chunk = 0.02, 4096
    commit = fake.repos["org/remote"].commit
    models = write_models_file(tmp_path, MODELS_TOML.replace('hub_id = "org/remote"', f'hub_id = "org/remote"\nrevision = "{commit}"'))
    loader = Loader()
    app = make_app(models, loader)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot)
        await pick(pilot, screen, "remote-model")
        await wait_for(pilot, lambda: (bar(screen, "file").progress or 0) > 8192 and bar(screen, "file").total == len(WEIGHTS))
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.job is None)
        await pilot.pause()
        assert status_cell(screen, "remote-model") == "partial" and loader.calls == []
        fake.delay_s = 0.0
        await pick(pilot, screen, "remote-model")  # resumes the download, then loads
        await wait_for(pilot, lambda: loader.calls and isinstance(app.screen, ChatScreen))
        snap = hub.cached_snapshot("org/remote", commit)
        assert snap is not None and (snap / "model.safetensors").read_bytes() == WEIGHTS


async def test_an_unsupported_architecture_is_refused_before_its_weights_and_the_picker_stays(fake: FakeHub, tmp_path: Path) -> None:
    """models.toml lists models the loader cannot build yet (granite-4.0-350m: model_type "granite",
    falcon-h1: "falcon_h1"): Enter downloaded all of the weights, closed the picker, and only the
    load said the architecture was unknown. Now config.json is read first and the weights are
    never fetched."""
    fake.add_repo("org/granite", {"config.json": b'{"model_type": "granite"}', "model.safetensors": WEIGHTS})
    models = write_models_file(tmp_path, MODELS_TOML + '\n[[model]]\nname = "granite"\nhub_id = "org/granite"\nrole = ["drafter"]\n')
    loader = Loader()
    app = make_app(models, loader)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot)
        await pick(pilot, screen, "granite")
        await wait_for(pilot, lambda: any("model_type='granite'" in m and sev == "error" for m, sev in notices(app)))
        await wait_for(pilot, lambda: screen.job is None)
        assert app.screen is screen and loader.calls == []
        assert fake.bytes_sent.get("org/granite/model.safetensors", 0) == 0
        assert status_cell(screen, "granite") == "not downloaded"


async def test_a_second_picker_is_not_opened_over_the_first(models_file: Path) -> None:
    """Ctrl+P over the picker, then "Models" (Ctrl+O) there: a second picker opened over the first
    (one of them could be downloading), the stack ChatScreen, ModelsScreen, ..., ModelsScreen."""
    from textual.command import CommandPalette

    app = make_app(models_file, Loader())
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await open_picker(pilot)
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
        app.action_models()
        await pilot.pause()
        assert sum(isinstance(s, ModelsScreen) for s in app.screen_stack) == 1
        assert any("already open" in m for m, _ in notices(app))


async def test_an_entry_of_an_unsupported_architecture_says_so_before_any_download(fake: FakeHub, tmp_path: Path) -> None:
    """models.toml lists falcon-h1 (model_type falcon_h1) for its pairings: Enter downloaded its
    config.json only to be refused then; the picker now says so at once and fetches nothing."""
    models = write_models_file(tmp_path, MODELS_TOML + '\n[[model]]\nname = "falcon"\nhub_id = "org/remote"\n'
                               'role = ["target"]\nfamily = "falcon_h1"\n')
    loader = Loader()
    app = make_app(models, loader)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await open_picker(pilot)
        await pick(pilot, screen, "falcon")
        await pilot.pause()
        assert any("falcon: the falcon_h1 architecture is not supported yet" in m for m, _ in notices(app))
        assert "not loadable yet" in str(screen.query_one("#models-detail").render())
        assert isinstance(app.screen, ModelsScreen) and screen.job is None and not fake.requests and not loader.calls
