"""Ctrl+O: the model picker. models.toml entries with their availability, size and pairings, plus a
free Hub id; picking one that is not on disk downloads it first (a thread worker runs
:func:`engine.hub.download`), then the screen is dismissed with a :class:`ModelChoice` and the app
reloads the session.

Nothing here touches torch: availability is read from the cache layout (``engine.hub``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Static

from engine import hub
from engine.registry import ModelEntry, Registry

from ..keys import app_keys
from ..messages import error_line
from ..widgets.download import DownloadPanel

NO_DRAFTER = "none"


@dataclass(frozen=True)
class ModelChoice:
    """What to load: ``target`` is a models.toml name or a Hub id; ``drafter`` a name or "none".
    ``paired``: ``drafter`` is the target's default pairing's, loaded as at start-up (see
    :attr:`drafter_ref`)."""

    target: str
    drafter: str = NO_DRAFTER
    paired: bool = False

    @property
    def drafter_ref(self) -> str | None:
        """The drafter as the app's ModelLoader takes it: None for the default pairing's, so that
        ChatSession.load picks it from models.toml and, where it cannot be loaded (a damaged file),
        loads the target alone with a warning. Named, it failed the whole switch, as a drafter
        named with ``--drafter`` fails its load."""
        return None if self.paired else self.drafter


@dataclass(frozen=True)
class ModelRow:
    """One line of the picker."""

    name: str
    status: str  # "loaded" | "local" | "cached" | "partial" | "not downloaded" | "missing"
    size: str
    params: str
    role: str
    entry: ModelEntry

    @property
    def available(self) -> bool:
        return self.status in ("loaded", "local", "cached")


@dataclass
class DownloadJob:
    """A download the worker runs; ``choice`` is what to load once it is done."""

    repo_id: str
    revision: str | None
    choice: ModelChoice
    cancel: threading.Event


# ---- the rows (pure functions: tested without a screen) --------------------------------------------------
def model_rows(registry: Registry, current_target: str | None = None, cache_dir: Path | None = None) -> list[ModelRow]:
    """Every registry entry with where it would load from: its local file, the HF cache, or nowhere yet."""
    base = registry.path.parent if registry.path else None
    rows = []
    for e in registry.models.values():
        local = e.local_path(base)
        cached = hub.cached_snapshot(e.hub_id, e.revision, cache_dir) if e.hub_id and local is None else None
        where = local or cached
        if e.name == current_target or (e.hub_id and e.hub_id == current_target):  # (`specchat chat org/x`: its Hub id)
            status = "loaded"
        elif local is not None:
            status = "local"
        elif cached is not None:
            status = "cached"
        elif not e.hub_id:
            status = "missing"
        elif hub.has_partial(e.hub_id, cache_dir):
            status = "partial"
        else:
            status = "not downloaded"
        if where is not None:
            size = hub.format_bytes(hub.snapshot_size(where))
        else:
            size = f"~{hub.format_bytes(e.size_mb * 1e6)}" if e.size_mb else "?"
        rows.append(ModelRow(e.name, status, size, e.params or "", ",".join(e.role), e))
    return rows


def pairing_notes(registry: Registry, name: str) -> str:
    """``drafters: mamba-130m (same), …`` for a target, ``drafts for: …`` for a drafter ("" if unpaired)."""
    drafters = [p.drafter + (f" ({p.vocab})" if p.vocab else "") for p in registry.pairings if p.target == name]
    targets = [p.target for p in registry.pairings if p.drafter == name]
    parts = []
    if drafters:
        parts.append("drafters: " + ", ".join(drafters))
    if targets:
        parts.append("drafts for: " + ", ".join(targets))
    return "; ".join(parts)


def drafter_after_switch(registry: Registry, target: str, current_drafter: str | None,
                         available: Callable[[str], bool] | None = None) -> str:
    """The drafter loaded with ``target``: the current one where models.toml pairs it with the new
    target; else the target's default pairing's, as at start-up, where that drafter is on disk
    (``available``; None: assume it is); else none. (Switching away from a target and back left
    it without its drafter, and nothing in the app could bring the drafter back.)"""
    if current_drafter and any(p.target == target and p.drafter == current_drafter for p in registry.pairings):
        return current_drafter
    paired = registry.default_pairing(target)
    if paired is not None and (available is None or available(paired.drafter)):
        return paired.drafter
    return NO_DRAFTER


# ---- the screen ---------------------------------------------------------------------------------------
def unsupported(entry) -> bool:
    """A models.toml entry whose ``family`` (its config's model_type) the loader does not build."""
    return bool(entry.family) and entry.family not in hub.MODEL_TYPES


class ModelsScreen(ModalScreen[ModelChoice | None]):
    """Pick a model; dismissed with the :class:`ModelChoice` to load (None: closed)."""

    BINDINGS = [Binding("escape", "close_or_cancel", "Close", id="close_models")]

    class Progressed(Message):
        def __init__(self, progress: hub.Progress) -> None:
            super().__init__()
            self.progress = progress

    class Finished(Message):
        def __init__(self, job: DownloadJob, path: Path) -> None:
            super().__init__()
            self.job, self.path = job, path

    class Failed(Message):
        def __init__(self, job: DownloadJob, error: str, cancelled: bool) -> None:
            super().__init__()
            self.job, self.error, self.cancelled = job, error, cancelled

    DEFAULT_CSS = """
    ModelsScreen {
        align: center middle;
    }
    #models-dialog {
        width: 100%;
        max-width: 110;
        height: 100%;
        max-height: 30;
        border: round $primary;
        background: $surface;
    }
    #models-table {
        height: 1fr;
    }
    #models-detail {
        height: auto;
        max-height: 5;  /* facts, pairings, what the switch loads and the notes (wrapped) */
        padding: 0 1;
        color: $text-muted;
    }
    #models-hub-id {
        margin: 0 1;
    }
    """

    def __init__(self, registry: Registry, current_target: str | None = None, current_drafter: str | None = None,
                 cache_dir: Path | None = None, loading: str | None = None) -> None:
        super().__init__()
        self.registry = registry
        self.current_target = current_target
        self.current_drafter = current_drafter
        self.loading = loading  # the target of a pick still loading (picking the model in use then keeps it)
        self.cache_dir = cache_dir
        self.rows: dict[str, ModelRow] = {}
        self.job: DownloadJob | None = None
        self.done_choice: ModelChoice | None = None  # downloaded while another screen was on top: dismissed on resume

    def compose(self) -> ComposeResult:
        with Vertical(id="models-dialog") as dialog:
            dialog.border_title = "Models"
            dialog.border_subtitle = app_keys(self, "Enter: load (downloads first if needed) · {close_models}: close")
            yield DataTable(id="models-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="models-detail", markup=False)  # models.toml's text
            yield Input(placeholder="…or a Hub id (owner/name), Enter to load or download", id="models-hub-id")
            yield DownloadPanel(id="models-download")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        # what tells models apart first: at 60 columns "role" is what scrolls out of view, not "params"
        table.add_columns("model", "params", "status", "size", "role")
        self.refresh_rows()
        table.focus()

    def refresh_rows(self) -> None:
        """(Re)read availability from disk and redraw the table, keeping the cursor on its model."""
        table = self.query_one(DataTable)
        keep = self._highlighted()
        table.clear()
        self.rows = {r.name: r for r in model_rows(self.registry, self.current_target, self.cache_dir)}
        for r in self.rows.values():
            # a str cell is read as Rich markup: models.toml's text is escaped ("[/]" in a name raised)
            table.add_row(*(escape(c) for c in (r.name, r.params, r.status, r.size, r.role)), key=r.name)
        names = list(self.rows)
        focus = keep or self.current_target
        if focus in self.rows:
            table.move_cursor(row=names.index(focus))
        self._show_detail()

    def _highlighted(self) -> str | None:
        table = self.query_one(DataTable)
        if not self.rows or table.cursor_row < 0 or table.cursor_row >= table.row_count:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    @on(DataTable.RowHighlighted)
    def _show_detail(self) -> None:
        name = self._highlighted()
        detail = self.query_one("#models-detail", Static)
        if name is None:
            detail.update("")
            return
        e = self.rows[name].entry
        facts = " · ".join(x for x in (e.hub_id or e.local, e.family, e.license) if x)
        pairs = pairing_notes(self.registry, name) or "no pairings in models.toml"
        drafter = self._drafter_for(name)
        after = (f"keeps drafter {drafter}" if drafter == self.current_drafter else f"loads with its drafter {drafter}"
                 ) if drafter != NO_DRAFTER else "loads without a drafter model"
        if unsupported(e):
            after = f"not loadable yet: specchat does not build the {e.family} architecture"
        detail.update(f"{facts}\n{pairs}\n{after}" + (f" · {e.notes}" if e.notes else ""))

    def _drafter_for(self, target: str) -> str:
        return drafter_after_switch(self.registry, target, self.current_drafter,
                                    lambda name: name in self.rows and self.rows[name].available)

    # ---- choosing ------------------------------------------------------------------------------------
    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        self.choose_entry(str(event.row_key.value))

    @on(Input.Submitted, "#models-hub-id")
    def _hub_id_submitted(self, event: Input.Submitted) -> None:
        self.choose_ref(event.value.strip())

    def choose_ref(self, ref: str) -> None:
        """A models.toml name, or a Hub id (a registry entry with that hub_id counts as the entry)."""
        if ref in self.rows:
            return self.choose_entry(ref)
        for row in self.rows.values():
            if row.entry.hub_id == ref:
                return self.choose_entry(row.name)
        try:
            hub.check_repo_id(ref)
        except hub.DownloadError as exc:
            self.notify(str(exc), severity="error", markup=False)  # the user's text ("org/x[/]" crashed the app)
            return
        if ref == self.current_target and self.loading is None:
            # the Hub id in use (loaded from this box, or `specchat chat org/x`): it was loaded again,
            # seconds to minutes of a model already there, and without the drafter it had
            self.notify(f"{ref} is already loaded.", markup=False)
            return
        choice = ModelChoice(ref, NO_DRAFTER)
        if hub.cached_snapshot(ref, None, self.cache_dir) is not None:
            self.dismiss(choice)
        else:
            self.start_download(ref, None, choice)

    def choose_entry(self, name: str) -> None:
        row = self.rows[name]
        if self.job is not None:
            self.notify(app_keys(self, "A download is running: wait for it or cancel it ({close_models})."), severity="warning")
            return
        drafter = self._drafter_for(name)
        default = self.registry.default_pairing(name)
        choice = ModelChoice(name, drafter, paired=default is not None and default.drafter == drafter)
        if row.status == "loaded" and choice.drafter == (self.current_drafter or NO_DRAFTER) and self.loading is None:
            self.notify(f"{name} is already loaded.", markup=False)
            return
        if unsupported(row.entry):  # listed in models.toml for its pairings' sake: no download that would be refused
            self.notify(f"{name}: the {row.entry.family} architecture is not supported yet (supported: "
                        f"{', '.join(sorted(hub.MODEL_TYPES))})", severity="warning", markup=False)
            return
        if row.available:
            self.dismiss(choice)
        elif row.entry.hub_id is None:
            self.notify(f"{name}: its local file {row.entry.local!r} is missing and it has no hub_id", severity="error",
                        markup=False)
        else:
            self.start_download(row.entry.hub_id, row.entry.revision, choice)

    # ---- downloading ---------------------------------------------------------------------------------
    def start_download(self, repo_id: str, revision: str | None, choice: ModelChoice) -> None:
        if self.job is not None:
            self.notify(app_keys(self, "A download is running: wait for it or cancel it ({close_models})."), severity="warning")
            return
        self.job = DownloadJob(repo_id, revision, choice, threading.Event())
        self.query_one("#models-hub-id", Input).display = False
        self.query_one(DownloadPanel).begin(f"Downloading {repo_id}")
        self.query_one("#models-dialog", Vertical).border_subtitle = app_keys(self, "{close_models}: cancel the download")
        self._download(self.job)

    @work(thread=True, exclusive=True, group="download", exit_on_error=False)
    def _download(self, job: DownloadJob) -> None:
        """Worker thread: the whole download; reports come back as messages (thread-safe)."""
        try:
            path = hub.download(job.repo_id, job.revision, self.cache_dir,
                                progress=lambda p: self.post_message(self.Progressed(p)), cancel=job.cancel)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a toast
            self.post_message(self.Failed(job, error_line(exc), isinstance(exc, hub.DownloadCancelled)))
        else:
            self.post_message(self.Finished(job, path))

    def on_models_screen_progressed(self, message: Progressed) -> None:
        if self.job is not None and not self.job.cancel.is_set():
            self.query_one(DownloadPanel).show(message.progress)

    def on_models_screen_finished(self, message: Finished) -> None:
        self._end_download()
        self.notify(f"Downloaded {message.job.repo_id}.", timeout=4, markup=False)
        if self.is_active:
            self.dismiss(message.job.choice)
        else:  # the command palette over the picker: dismiss() pops the top screen, that one
            self.done_choice = message.job.choice

    def on_screen_resume(self) -> None:
        if self.done_choice is not None and self.is_active:  # (not when another screen went on top at once)
            choice, self.done_choice = self.done_choice, None
            self.dismiss(choice)

    def on_models_screen_failed(self, message: Failed) -> None:
        self._end_download()
        if message.cancelled:
            self.notify(message.error, title="Download cancelled", severity="warning", timeout=6, markup=False)
        else:
            self.notify(message.error, title="Download failed", severity="error", timeout=10, markup=False)
        self.refresh_rows()

    def _end_download(self) -> None:
        self.job = None
        self.query_one(DownloadPanel).end()
        self.query_one("#models-hub-id", Input).display = True
        self.query_one("#models-dialog", Vertical).border_subtitle = app_keys(self, "Enter: load (downloads first if needed) · {close_models}: close")
        self.query_one(DataTable).focus()

    @on(Button.Pressed, "#download-cancel")
    def cancel_download(self) -> None:
        """Ask the worker to stop after its current chunk; it keeps the partial file."""
        if self.job is not None and not self.job.cancel.is_set():
            self.job.cancel.set()
            self.query_one(DownloadPanel).cancelling()

    def action_close_or_cancel(self) -> None:
        """Esc: cancel a running download, else close the picker."""
        if self.job is not None:
            self.cancel_download()
        else:
            self.dismiss(None)

    def on_unmount(self) -> None:
        if self.job is not None:
            self.job.cancel.set()
