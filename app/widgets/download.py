"""A download in progress: per-file and total progress bars with bytes, rate and ETA, and Cancel.

The owner feeds it :class:`engine.hub.Progress` reports (posted by its download worker) and handles
the Cancel button (``Button.Pressed`` with id ``download-cancel``).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Label, ProgressBar

from engine.hub import Progress, format_bytes, format_rate

from ..keys import app_keys


class DownloadPanel(Vertical):
    """Hidden until :meth:`begin`; :meth:`show` updates it, :meth:`end` hides it again."""

    DEFAULT_CSS = """
    DownloadPanel {
        height: auto;
        padding: 0 1;
        border-top: solid $primary 40%;
        display: none;
    }
    DownloadPanel.-active {
        display: block;
    }
    DownloadPanel #download-title {
        text-style: bold;
    }
    DownloadPanel Horizontal {
        height: 1;
    }
    DownloadPanel ProgressBar {
        width: auto;
    }
    DownloadPanel ProgressBar Bar {
        width: 20;
    }
    DownloadPanel Label.download-text {
        width: 1fr;
        margin: 0 0 0 1;
        color: $text-muted;
    }
    """

    def compose(self) -> ComposeResult:
        # plain text: repo ids and file names come from the user and the Hub ("tokenizer[v2].json")
        yield Label("", id="download-title", markup=False)
        with Horizontal():
            yield ProgressBar(id="download-file-bar", show_eta=False)
            yield Label("", id="download-file", classes="download-text", markup=False)
        with Horizontal():
            yield ProgressBar(id="download-total-bar", show_eta=False)
            yield Label("", id="download-total", classes="download-text", markup=False)
        yield Button(app_keys(self, "Cancel ({close_models})"), id="download-cancel", variant="error", compact=True)

    @property
    def active(self) -> bool:
        return self.has_class("-active")

    def begin(self, title: str) -> None:
        """Show the panel for a new download; the bars pulse until the first report gives sizes."""
        self.add_class("-active")
        self.query_one("#download-title", Label).update(f"{title}: listing files…")
        for bar in self.query(ProgressBar):
            bar.update(total=None, progress=0)
        self.query_one("#download-file", Label).update("")
        self.query_one("#download-total", Label).update("")
        self.query_one("#download-cancel", Button).disabled = False

    def show(self, p: Progress) -> None:
        """One report: file ``k/N`` and its bytes on the first bar, the whole download on the second."""
        self.query_one("#download-title", Label).update(f"Downloading {p.repo_id} · file {p.file_index}/{p.file_count}")
        self.query_one("#download-file-bar", ProgressBar).update(total=max(p.file_total, 1), progress=p.file_done)
        self.query_one("#download-file", Label).update(
            f"{p.file} {format_bytes(p.file_done)} / {format_bytes(p.file_total)}")
        self.query_one("#download-total-bar", ProgressBar).update(total=max(p.total, 1), progress=p.done)
        rate = format_rate(p)
        self.query_one("#download-total", Label).update(
            f"total {format_bytes(p.done)} / {format_bytes(p.total)}" + (f" · {rate}" if rate else ""))

    def cancelling(self) -> None:
        self.query_one("#download-title", Label).update("Cancelling… (the partial file is kept)")
        self.query_one("#download-cancel", Button).disabled = True

    def end(self) -> None:
        self.remove_class("-active")
