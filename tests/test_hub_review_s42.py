"""Review (session 42) of download cancellation: each test here failed before its fix.

A cancel (Esc in the picker, Ctrl-C in the CLI, quitting the app) was only checked between reads,
so a server that stopped sending held it for the whole read timeout (HF_HUB_DOWNLOAD_TIMEOUT, 10 s
by default; 30 s here so that a pass cannot be the timeout's doing).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import hub

from .fakehub import FakeHub

WEIGHTS = os.urandom(300_000)
FILES = {"config.json": b'{"model_type": "llama"}', "model.safetensors": WEIGHTS}
PROMPT_S = 2.0  # a cancel takes effect within this (it takes ~0.1 s; the margin is for a loaded machine)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHub]:
    with FakeHub() as fh:
        fh.add_repo("org/tiny", FILES)
        fh.use(monkeypatch, tmp_path)
        monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "30")
        monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "30")
        yield fh
    assert fh.thread is not None
    fh.thread.join(5)
    assert not fh.thread.is_alive(), "the fake Hub's server thread outlived the test"


class SilentServer:
    """Accepts connections and reads the request, then answers nothing until closed (a Hub or a
    proxy that hangs before its headers)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.accepted = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, name="silent-hub", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: the test is over
                return
            self.conns.append(conn)
            self.accepted.set()

    def close(self) -> None:
        # shutdown() wakes the accept() blocked in the thread (close() alone does not on Linux)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for conn in self.conns:
            conn.close()
        self.thread.join(5)


def download_in_thread(cancel: threading.Event, **kwargs: object) -> tuple[threading.Thread, dict[str, object]]:
    """Run hub.download("org/tiny") in a thread; the dict gets ``error`` or ``path``, and ``ended``
    (time.monotonic()) when it returns."""
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["path"] = hub.download("org/tiny", cancel=cancel, **kwargs)  # type: ignore[arg-type]
        except BaseException as e:  # noqa: BLE001 - checked by the test
            result["error"] = e
        finally:
            result["ended"] = time.monotonic()

    thread = threading.Thread(target=run, name="download", daemon=True)
    thread.start()
    return thread, result


def wait(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {condition}"
        time.sleep(0.01)


def cancel_promptly(cancel: threading.Event, thread: threading.Thread, result: dict, server: str) -> BaseException:
    """Cancel the download ``thread`` runs: it ends within PROMPT_S with DownloadCancelled, returned."""
    asked = time.monotonic()
    cancel.set()
    thread.join(PROMPT_S + 5)
    assert not thread.is_alive(), f"the download is still waiting on the {server} server"
    assert result["ended"] - asked < PROMPT_S  # type: ignore[operator]
    err = result["error"]
    assert isinstance(err, hub.DownloadCancelled), err
    return err


def test_a_cancel_during_a_stalled_transfer_takes_effect_at_once(fake: FakeHub, tmp_path: Path) -> None:
    """The server sends 100 kB of the weights, then nothing: the cancel returned only when the read
    timed out. Now it returns at once, keeps the partial file for a resume, and links no snapshot."""
    fake.hold_after = 100_000
    cancel = threading.Event()
    thread, result = download_in_thread(cancel)
    wait(fake.held.is_set)
    wait(lambda: hub.has_partial("org/tiny"))
    time.sleep(0.2)  # the client is blocked in its read now
    err = cancel_promptly(cancel, thread, result, "stalled")
    assert "cancelled" in str(err) and "resume" in str(err) and "\n" not in str(err)

    storage = tmp_path / "cache" / "models--org--tiny"
    (part,) = (storage / "blobs").glob("*.incomplete")
    assert part.read_bytes() == WEIGHTS[:part.stat().st_size] and 0 < part.stat().st_size < len(WEIGHTS)
    assert not (storage / "snapshots").exists() and not (storage / "refs").exists()
    assert hub.cached_snapshot("org/tiny") is None

    fake.hold_after = None
    fake.release.set()
    snap = hub.download("org/tiny")  # the partial file resumes
    assert (snap / "model.safetensors").read_bytes() == WEIGHTS


def test_a_cancel_while_the_hub_does_not_answer_takes_effect_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A Hub that takes the listing request and answers nothing: the cancel waited out
    HF_HUB_ETAG_TIMEOUT, then said the Hub was unreachable rather than that it was cancelled."""
    server = SilentServer()
    try:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "30")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        cancel = threading.Event()
        thread, result = download_in_thread(cancel)
        assert server.accepted.wait(10)
        time.sleep(0.2)
        err = cancel_promptly(cancel, thread, result, "silent")
        assert str(err) == "download of org/tiny cancelled while listing its files; run it again to resume"
    finally:
        server.close()
    assert not server.thread.is_alive()
    assert not (tmp_path / "cache" / "models--org--tiny").exists()


def test_a_download_that_is_not_cancelled_leaves_no_thread_behind(fake: FakeHub) -> None:
    """(A guard, not a failure before:) the watch that cuts a cancelled download's connection ends
    with the download, and a download run after a cancelled one in the same thread is not cut."""
    before = set(threading.enumerate())
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(hub.DownloadCancelled):
        hub.download("org/tiny", cancel=cancelled)
    snap = hub.download("org/tiny", cancel=threading.Event())
    assert (snap / "model.safetensors").read_bytes() == WEIGHTS
    wait(lambda: not [t for t in threading.enumerate() if t not in before and t.name.startswith("specchat-")], 2)
