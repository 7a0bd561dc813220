"""A local stand-in for the Hugging Face Hub (http.server on 127.0.0.1, port 0, in a thread).

Serves the two endpoints engine.hub uses, the way huggingface.co answers them:

    GET /api/models/{org}/{name}/revision/{rev}?blobs=true   -> {"sha", "siblings": [{rfilename, size, blobId, lfs}]}
    GET /{org}/{name}/resolve/{rev}/{path}                    -> the bytes; Range: bytes=N- gives 206

Errors carry the Hub's ``X-Error-Code`` header (RepoNotFound, RevisionNotFound, GatedRepo,
EntryNotFound). Knobs for the tests: ``drop_after`` / ``drops`` (close the connection after N body
bytes, that many times, in files longer than N), ``delay_s`` + ``chunk`` (a slow transfer),
``missing_status`` (404, or 401 as the real Hub answers anonymous callers), ``ranges`` (False: a
server that ignores Range), ``hold_after`` (pause files longer than N after exactly N body bytes:
``held`` is set then, and the rest is sent once ``release`` is set; close() releases it). It
records every request and the body bytes sent per file, so tests can prove what was (not) fetched.

    with FakeHub() as hub:
        hub.add_repo("org/tiny", {"config.json": b"{}", "model.safetensors": b"..."})
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LFS_MIN = 1024  # files at least this big are listed as LFS (with a sha256), as the Hub does for weights
HOLD_TIMEOUT_S = 30.0  # a held transfer never outlives a broken test by more than this


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    commit: str
    revisions: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit
    gated: bool = False
    extra_siblings: list[dict[str, Any]] = field(default_factory=list)  # listed as is (bad names, missing files)

    def sibling(self, path: str) -> dict[str, Any]:
        data = self.files[path]
        entry: dict[str, Any] = {"rfilename": path, "size": len(data), "blobId": git_blob_id(data)}
        if len(data) >= LFS_MIN:
            entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def commit_of(self, rev: str) -> str | None:
        return rev if rev == self.commit else self.revisions.get(rev)


class FakeHub:
    """The fake Hub server; use it as a context manager (or call start()/close())."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str]] = []  # (path, Range header or "")
        self.bytes_sent: Counter[str] = Counter()  # "org/name/file" -> body bytes written
        self.drop_after: int | None = None
        self.drops = 0
        self.delay_s = 0.0
        self.chunk = 64 * 1024
        self.missing_status = 404
        self.ranges = True  # False: ignore Range headers (answer 200 with the whole file)
        self.hold_after: int | None = None  # pause mid-file after this many body bytes (a fixed mid-download state)
        self.held = threading.Event()  # set while a transfer is paused at hold_after
        self.release = threading.Event()  # set it to let held transfers go on
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    # ---- setup -------------------------------------------------------------------------------------
    def use(self, monkeypatch, tmp_path) -> None:
        """Point huggingface settings at this server and a cache under ``tmp_path`` (no real Hub, no real cache)."""
        monkeypatch.setenv("HF_ENDPOINT", self.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_TOKEN", raising=False)

    def add_repo(self, repo_id: str, files: dict[str, bytes], *, gated: bool = False, branch: str = "main") -> FakeRepo:
        commit = hashlib.sha1(repo_id.encode() + "\0".join(sorted(files)).encode()).hexdigest()
        repo = FakeRepo(repo_id, dict(files), commit, {branch: commit}, gated)
        self.repos[repo_id] = repo
        return repo

    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            fake = hub

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="fakehub", daemon=True)
        self.thread.start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None, "start() the FakeHub first"
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self) -> "FakeHub":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- what happened ---------------------------------------------------------------------------
    def file_requests(self) -> list[str]:
        """Paths of every resolve request (the files the client asked for)."""
        return [urllib.parse.unquote(p.split("/resolve/", 1)[1].split("/", 1)[1]) for p, _ in self.requests if "/resolve/" in p]

    def take_drop(self) -> bool:
        with self.lock:
            if self.drop_after is not None and self.drops > 0:
                self.drops -= 1
                return True
            return False


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        fake = self.fake
        url = urllib.parse.urlsplit(self.path)
        with fake.lock:
            fake.requests.append((url.path, self.headers.get("Range", "")))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", url.path)
        if m:
            return self._listing(m.group(1), urllib.parse.unquote(m.group(2)), "blobs=true" in url.query.lower())
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", url.path)
        if m:
            return self._resolve(m.group(1), urllib.parse.unquote(m.group(2)), urllib.parse.unquote(m.group(3)))
        self._error(404, "", "no such endpoint")

    # ---- endpoints ---------------------------------------------------------------------------------
    def _listing(self, repo_id: str, rev: str, blobs: bool) -> None:
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            return self._error(self.fake.missing_status, "RepoNotFound", "Repository not found")
        commit = repo.commit_of(rev)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        siblings = [repo.sibling(p) if blobs else {"rfilename": p} for p in sorted(repo.files)]
        body = json.dumps({"id": repo_id, "sha": commit, "gated": "manual" if repo.gated else False,
                           "siblings": siblings + repo.extra_siblings}).encode()
        self._send(200, body, {"Content-Type": "application/json"})

    def _resolve(self, repo_id: str, rev: str, path: str) -> None:
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            return self._error(self.fake.missing_status, "RepoNotFound", "Repository not found")
        if repo.commit_of(rev) is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if repo.gated:
            return self._error(401, "GatedRepo", "Access to this model is restricted")
        if path not in repo.files:
            return self._error(404, "EntryNotFound", f"{path} does not exist")
        data = repo.files[path]
        start = 0
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        if m and self.fake.ranges:
            start = int(m.group(1))
            if start >= len(data):
                return self._error(416, "", "Range not satisfiable")
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{repo.sibling(path).get("lfs", {}).get("sha256") or git_blob_id(data)}"')
        self.end_headers()
        self._body(f"{repo_id}/{path}", data[start:])

    def _body(self, key: str, data: bytes) -> None:
        fake = self.fake
        long_enough = fake.drop_after is not None and len(data) > fake.drop_after
        drop_at = fake.drop_after if long_enough and fake.take_drop() else None
        hold_at = fake.hold_after if fake.hold_after is not None and len(data) > fake.hold_after else None
        sent = 0
        while sent < len(data):
            if hold_at is not None and sent == hold_at:  # the client has exactly hold_at bytes: pause
                fake.held.set()
                fake.release.wait(HOLD_TIMEOUT_S)
                hold_at = None
            n = min(fake.chunk, len(data) - sent)
            if hold_at is not None:
                n = min(n, hold_at - sent)
            if drop_at is not None:
                n = min(n, drop_at - sent)
                if n <= 0:  # drop the connection mid-file, the way a flaky network does
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
            with fake.lock:  # booked before the write: once the client has the bytes, they are counted
                fake.bytes_sent[key] += n
            try:
                self.wfile.write(data[sent:sent + n])
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                with fake.lock:
                    fake.bytes_sent[key] -= n
                return  # the client went away (cancelled)
            sent += n
            if fake.delay_s:
                time.sleep(fake.delay_s)

    def _error(self, status: int, code: str, message: str) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), headers)

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def write_models_file(tmp_path, text: str):
    """A models.toml with ``text`` beside a stub local.gguf (the picker's "local" entry) in tmp_path."""
    (tmp_path / "local.gguf").write_bytes(b"GGUF" + b"\0" * 100)
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path
