"""Downloads from the Hugging Face Hub into the standard HF cache, with progress, cancel and resume.

    path = download("EleutherAI/pythia-160m", progress=print, cancel=threading.Event())

``HF_ENDPOINT`` (read at call time) points it at a mirror or a test server. The file GETs are our
own (urllib, HTTP Range) rather than ``hf_hub_download``: that one reports progress only through a
tqdm class and cannot be cancelled between chunks. The layout is huggingface_hub's, so
``engine.loading.resolve`` (``snapshot_download(local_files_only=True)``) finds what we fetch:

    $HF_HUB_CACHE/models--org--name/blobs/<sha256 | git blob id>[.incomplete]
    $HF_HUB_CACHE/models--org--name/snapshots/<commit>/<file> -> ../../blobs/<id>
    $HF_HUB_CACHE/models--org--name/refs/<revision>             (written last: only whole snapshots)

Only top-level weights / tokenizer / config files are fetched (``PATTERNS``), never ``*.py``
(no remote code). Every failure is a one-line :class:`DownloadError`; a cancelled or broken
transfer keeps ``<blob>.incomplete`` and the next run resumes it with a Range request. A cancel
takes effect within ~0.1 s even where the server has stopped sending (:class:`_Watch` cuts the
connection), not after the read timeout.
This module never imports textual or torch (the UI calls it from a thread worker).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import TextIO

from .errors import SpecchatError

# What a model needs; *.py (remote code) is never fetched, whatever ``include`` says.
PATTERNS = ["*.json", "*.safetensors", "*.gguf", "tokenizer*", "*.model", "*.jinja", "*.txt", "pytorch_model*.bin"]
DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
CHUNK = 1 << 20  # bytes per read: the cancel flag is checked this often
PROGRESS_INTERVAL_S = 0.1  # the callback fires at most this often (plus at every file boundary)
RATE_WINDOW_S = 10.0  # the rate is smoothed over this many seconds (ollama: 10 one-second buckets)
ATTEMPTS = 3  # per file: a connection dropped mid-transfer is resumed this many times in one run
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")


class DownloadError(SpecchatError):
    """A download failed; the message is one line and says what to do next."""


class HubUnreachable(DownloadError):
    """No connection to HF_ENDPOINT (offline, DNS, refused, timed out); ``reason`` says which."""

    def __init__(self, problem: str, reason: str = "") -> None:
        super().__init__(problem)
        self.reason = reason


class GatedRepo(DownloadError):
    """401/403: the repo is gated or private and needs a token."""


class RepoNotFound(DownloadError):
    """404: no such repo (or a private one the token cannot see)."""


class RevisionNotFound(DownloadError):
    """The repo exists but the branch / tag / commit does not."""


class NotAModelRepo(DownloadError):
    """The listing has no config.json and no .gguf, or a config without weights."""


class UnsafeFileName(DownloadError):
    """The listing names a file outside the snapshot directory (``..``, absolute paths)."""


class DiskSpaceError(DownloadError):
    """The files to fetch do not fit in the free space of the cache's disk."""


class DownloadCancelled(DownloadError):
    """The cancel event was set; partial files are kept for the next run."""


# ---- data ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RepoFile:
    """One file of the listing: ``blob`` names it in blobs/ (the LFS sha256, else the git blob id)."""

    path: str
    size: int
    blob: str
    sha256: str | None = None  # LFS files: verified after the transfer
    git_oid: str | None = None  # other files: git's sha1 of "blob <size>\\0<content>", verified too


@dataclass
class Plan:
    """What a download will fetch: the commit, the selected files, and what the cache already has."""

    repo_id: str
    revision: str
    commit: str
    files: list[RepoFile]
    cache_dir: Path
    present: dict[str, int] = field(default_factory=dict)  # path -> bytes already on disk

    @property
    def storage(self) -> Path:
        return self.cache_dir / repo_folder(self.repo_id)

    @property
    def snapshot(self) -> Path:
        return self.storage / "snapshots" / self.commit

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def done(self) -> int:
        return sum(self.present.values())

    @property
    def needed(self) -> int:
        """Bytes still to transfer (resumed partial files count as done)."""
        return self.total - self.done

    def blob_path(self, f: RepoFile) -> Path:
        return self.storage / "blobs" / f.blob


@dataclass(frozen=True)
class Progress:
    """One progress report. ``done``/``total`` are bytes of the whole download (resumed bytes
    count as done); ``rate`` is bytes/s over the last seconds (0 until measurable)."""

    repo_id: str
    file: str
    file_index: int  # 1-based
    file_count: int
    file_done: int
    file_total: int
    done: int
    total: int
    rate: float = 0.0
    eta_s: float | None = None
    file_complete: bool = False  # the last report of this file
    finished: bool = False  # the last report of the download

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


ProgressCallback = Callable[[Progress], None]


# ---- configuration ---------------------------------------------------------------------------------
def endpoint() -> str:
    """$HF_ENDPOINT (read now, so tests and mirrors can change it) or the public Hub. One that is not
    an http(s) URL with a host is a one-line error naming it (urllib said "unknown url type: '.../api/
    models/...'", or "host name not found" for ftp://)."""
    url = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    try:
        parts = urllib.parse.urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
    except ValueError:  # "http://[::1", a port that is not a number or out of range
        ok = False
    if not ok:
        raise DownloadError(f"HF_ENDPOINT={os.environ.get('HF_ENDPOINT')!r} is not a valid http(s) URL (e.g. https://huggingface.co)")
    return url


def default_cache_dir() -> Path:
    """huggingface_hub's cache: $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expanduser(os.environ["HF_HUB_CACHE"]))
    return _hf_home() / "hub"


def _hf_home() -> Path:
    if os.environ.get("HF_HOME"):
        return Path(os.path.expanduser(os.environ["HF_HOME"]))
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface"


TOKEN = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces: what an HTTP header can carry as is


def _token() -> str | None:
    """$HF_TOKEN, else the token file `hf auth login` writes. One with a line break, a space or a
    non-ASCII character is refused without being shown (http.client's own error printed the header,
    the secret with it)."""
    if os.environ.get("HF_TOKEN"):
        token, source = os.environ["HF_TOKEN"].strip(), "HF_TOKEN is not a Hub token"
    else:
        path = Path(os.environ.get("HF_TOKEN_PATH") or _hf_home() / "token")
        try:
            token, source = path.read_text(encoding="utf-8").strip(), f"{path} does not hold a Hub token"
        except (OSError, UnicodeDecodeError):
            return None
    if token and not TOKEN.match(token):
        raise DownloadError(f"{source} (it has {len(token)} characters, with spaces, line breaks or non-ASCII ones among them); "
                            "set the token alone (`hf auth login`)")
    return token or None


def _timeout(var: str) -> float:
    """Seconds from $var; 10 where it is unset or not a positive finite number (a socket refuses
    0 as "operation in progress", -1 and NaN with a bare "Timeout value out of range")."""
    try:
        t = float(os.environ.get(var, "10"))
    except ValueError:
        return 10.0
    return t if 0 < t < float("inf") else 10.0


def repo_folder(repo_id: str) -> str:
    """``org/name`` -> ``models--org--name`` (huggingface_hub's cache folder name)."""
    return "models--" + repo_id.replace("/", "--")


def check_repo_id(repo_id: str) -> str:
    """``owner/name`` or a one-line error (``..`` and other path tricks are refused)."""
    if not REPO_ID.match(repo_id or "") or ".." in repo_id:
        raise DownloadError(f"{repo_id!r} is not a Hub id (expected owner/name)")
    return repo_id


def _check_revision(revision: str) -> str:
    parts = revision.split("/")
    if not revision or revision.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in revision:
        raise DownloadError(f"{revision!r} is not a valid revision")
    return revision


# ---- the cache, offline --------------------------------------------------------------------------
def cached_snapshot(repo_id: str, revision: str | None = None, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The cached snapshot of ``repo_id`` at ``revision`` if it holds a model (config.json or a
    .gguf), as ``engine.loading.resolve`` would find it; no network."""
    if not REPO_ID.match(repo_id or ""):
        return None
    storage = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    storage = storage / repo_folder(repo_id)
    rev = revision or DEFAULT_REVISION
    commit = rev if COMMIT.match(rev) else None
    if commit is None:
        try:
            commit = (storage / "refs" / rev).read_text(encoding="utf-8").strip()
        except (OSError, ValueError):
            return None
    snap = storage / "snapshots" / commit
    try:
        found = any(p.is_file() for p in snap.glob("*.gguf")) or ((snap / "config.json").is_file() and _has_weights(snap))
    except OSError:  # another user's folder in a shared cache (PermissionError): not cached for this user
        return None
    return snap if found else None


def _has_weights(snap: Path) -> bool:
    """The weights beside a config.json are there (links followed), every shard a
    ``*.safetensors.index.json`` names too: huggingface_hub writes refs/<branch> before the files and
    links each as it lands, so a download of it that stopped left a config.json and no weights."""
    weights = [p for pattern in ("*.safetensors", "pytorch_model*.bin") for p in snap.glob(pattern)]
    if not any(p.is_file() for p in weights):
        return False
    for index in snap.glob("*.index.json"):
        try:
            shards = set(json.loads(index.read_bytes().decode("utf-8"))["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not readable: the loader says what is wrong with it
        top = [s for s in shards if isinstance(s, str) and s and "/" not in s and "\\" not in s and s not in (".", "..")]
        if not all((snap / s).is_file() for s in top):
            return False
    return True


def has_partial(repo_id: str, cache_dir: str | os.PathLike | None = None) -> bool:
    """A cancelled or broken download of ``repo_id`` left a partial file that the next run resumes."""
    if not REPO_ID.match(repo_id or ""):
        return False
    storage = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / repo_folder(repo_id)
    try:
        return any((storage / "blobs").glob("*.incomplete"))
    except OSError:  # a folder this user cannot read: nothing of it that this user could resume
        return False


def snapshot_size(path: Path) -> int:
    """Bytes of the files of a snapshot (links followed) or of one file."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


# ---- talking to the Hub ------------------------------------------------------------------------------
class _AuthOnSameHost(urllib.request.HTTPRedirectHandler):
    """Follow redirects (the Hub sends LFS files to a CDN) but never hand the token to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


class _Watch:
    """Cuts the connection a download is blocked on once its cancel event is set, from a small
    thread of its own: a server that stops sending mid-file (or before its headers) held a cancel,
    Ctrl-C, or quitting the app for the whole read timeout (HF_HUB_DOWNLOAD_TIMEOUT, 10 s), since
    the downloading thread checks the event only between reads. Each connection the downloading
    thread opens is followed through a dup of its socket: shutdown() of the dup wakes a recv()
    blocked on the original (TLS handshakes included, as the TLS socket is the same kernel socket),
    and the dup stays valid whatever urllib and ssl do with the original object (ssl detaches it)."""

    POLL_S = 0.05  # how often the watch looks at the cancel event (an Event cannot call back)

    def __init__(self, cancel: threading.Event) -> None:
        self.cancel = cancel
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None  # the dup of the newest connection's socket
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self._run, name="specchat-download-cancel", daemon=True)
        self.outer: _Watch | None = None

    def __enter__(self) -> "_Watch":
        self.outer, _watched.watch = getattr(_watched, "watch", None), self
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        _watched.watch = self.outer
        self.ended.set()
        self.thread.join()
        with self.lock:
            self._drop()

    def follow(self, sock: socket.socket) -> None:
        """A new connection of the downloading thread. urllib opens one per request and closes the
        previous one first (a redirect reads and closes its response), so only the newest is kept."""
        with self.lock:
            self._drop()
            self.sock = sock.dup()
            if self.cancel.is_set():
                self._cut()

    def _run(self) -> None:
        while not self.ended.wait(self.POLL_S):
            if self.cancel.is_set():
                with self.lock:
                    self._cut()
                return

    def _cut(self) -> None:
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # not connected any more: nothing is blocked on it
                pass

    def _drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


_watched = threading.local()  # .watch: the _Watch of the download this thread runs, if any


def _watched_connection(*args: object, **kwargs: object) -> socket.socket:
    """socket.create_connection, followed by the calling thread's download watch (if it has one)."""
    sock = socket.create_connection(*args, **kwargs)  # type: ignore[arg-type]
    watch = getattr(_watched, "watch", None)
    if watch is not None:
        try:
            watch.follow(sock)
        except OSError:  # out of file descriptors for the dup: the download goes on, unwatched
            pass
    return sock


class _WatchedHTTPHandler(urllib.request.HTTPHandler):
    def do_open(self, http_class, req, **kwargs):  # noqa: ANN001, ANN201 - urllib's signature
        return super().do_open(_watched_class(http_class), req, **kwargs)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def do_open(self, http_class, req, **kwargs):  # noqa: ANN001, ANN201 - urllib's signature
        return super().do_open(_watched_class(http_class), req, **kwargs)


def _watched_class(http_class: type) -> Callable[..., http.client.HTTPConnection]:
    """``http_class`` whose connections open through :func:`_watched_connection`; HTTPConnection
    connects with its ``_create_connection`` attribute (HTTPSConnection too, before wrapping)."""
    def make(*args: object, **kwargs: object) -> http.client.HTTPConnection:
        conn = http_class(*args, **kwargs)
        conn._create_connection = _watched_connection
        return conn
    return make


_opener = urllib.request.build_opener(_AuthOnSameHost, _WatchedHTTPHandler, _WatchedHTTPSHandler)


def _request(url: str, headers: dict[str, str] | None = None) -> urllib.request.Request:
    req = urllib.request.Request(url, headers={"User-Agent": "specchat", **(headers or {})})
    token = _token()
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    return req


def _open(req: urllib.request.Request, timeout: float, repo_id: str, revision: str, what: str) -> http.client.HTTPResponse:
    """Open ``req``; HTTP and connection failures become one-line DownloadErrors."""
    try:
        return _opener.open(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        with e:
            raise _http_error(e.code, e.headers.get("X-Error-Code", ""), repo_id, revision, what) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = _reason(getattr(e, "reason", e))
        raise HubUnreachable(f"cannot reach the Hugging Face Hub at {endpoint()} to download {repo_id} (offline? "
                             f"{reason}); a partial download resumes when you retry", reason) from None


def _reason(reason: object) -> str:
    if isinstance(reason, socket.gaierror):
        return "host name not found"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "timed out"
    text = str(reason).strip().splitlines()
    return text[0][:120] if text else type(reason).__name__


def _http_error(code: int, error_code: str, repo_id: str, revision: str, what: str) -> DownloadError:
    if error_code == "GatedRepo" or code == 403 or (code == 401 and error_code != "RepoNotFound"):
        return GatedRepo(f"{repo_id} is gated or private: accept its terms at {endpoint()}/{repo_id} and log in "
                         "(set HF_TOKEN or run `hf auth login`)")
    if error_code == "RevisionNotFound":
        return RevisionNotFound(f"{repo_id}: revision {revision!r} not found on the Hub")
    if error_code == "RepoNotFound" or (code == 404 and what == "listing"):
        return RepoNotFound(f"{repo_id}: no such model on the Hub (or it is private: log in first)")
    if code == 404:
        return DownloadError(f"{repo_id}: {what} is listed but missing on the server (HTTP 404)")
    return DownloadError(f"the Hub answered HTTP {code} for {repo_id} ({what}); try again later")


def list_files(repo_id: str, revision: str | None = None) -> tuple[str, list[RepoFile]]:
    """(commit, every file of the repo with its size) from ``/api/models/{repo}/revision/{rev}?blobs=true``."""
    rev = _check_revision(revision or DEFAULT_REVISION)
    url = f"{endpoint()}/api/models/{check_repo_id(repo_id)}/revision/{urllib.parse.quote(rev, safe='')}?blobs=true"
    with _open(_request(url), _timeout("HF_HUB_ETAG_TIMEOUT"), repo_id, rev, "listing") as resp:
        try:
            info = json.loads(resp.read().decode("utf-8"))
            commit = str(info["sha"])
            siblings = info.get("siblings") or []
            if not isinstance(siblings, list):
                raise TypeError("siblings is not a list")
        except (ValueError, KeyError, TypeError, AttributeError, OSError, http.client.HTTPException):
            raise DownloadError(f"{repo_id}: the Hub's answer is not a model listing (is HF_ENDPOINT a Hub?)") from None
    if not COMMIT.match(commit):
        raise DownloadError(f"{repo_id}: the Hub listing has no commit hash")
    return commit, [_repo_file(repo_id, commit, s) for s in siblings]


def _repo_file(repo_id: str, commit: str, sibling: dict) -> RepoFile:
    lfs = (sibling.get("lfs") or {}) if isinstance(sibling, dict) else None
    ids = (sibling.get("blobId"), lfs.get("sha256"), lfs.get("oid")) if isinstance(lfs, dict) else ()
    size = sibling.get("size") if isinstance(sibling, dict) else None
    if (not isinstance(lfs, dict) or not isinstance(sibling.get("rfilename"), str)
            or any(v is not None and not isinstance(v, str) for v in ids)
            or size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0)):
        # a mirror's own format, a proxy's page: AttributeError and TypeError tracebacks before
        raise DownloadError(f"{repo_id}: the Hub listing has a malformed entry ({json.dumps(sibling)[:120]}); "
                            "is HF_ENDPOINT a Hub?")
    path = sibling["rfilename"]
    check_file_name(repo_id, path)
    if size is None:
        raise DownloadError(f"{repo_id}: the Hub listing has no size for {path} (HF_ENDPOINT mirror without ?blobs=true?)")
    sha256 = lfs.get("sha256") or lfs.get("oid")
    oid = sibling.get("blobId")
    blob = sha256 or oid or hashlib.sha256(f"{commit}/{path}".encode()).hexdigest()
    if not re.fullmatch(r"[0-9a-f]{40,64}", blob):
        raise UnsafeFileName(f"{repo_id}: refusing blob id {blob[:80]!r} from the Hub listing")
    return RepoFile(path, size, blob, sha256, None if sha256 else oid)


def check_file_name(repo_id: str, path: str) -> str:
    """Refuse names that would land outside the snapshot (``..``, absolute, drive or backslash paths)."""
    parts = path.split("/")
    if (not path or path.startswith(("/", "~")) or "\\" in path or "\x00" in path or re.match(r"^[A-Za-z]:", path)
            or any(p in ("", ".", "..") for p in parts)):
        raise UnsafeFileName(f"{repo_id}: refusing unsafe file name {path[:120]!r} in the Hub listing")
    return path


# ---- choosing files ----------------------------------------------------------------------------------
def select_files(repo_id: str, files: Sequence[RepoFile], include: Sequence[str] | None = None) -> list[RepoFile]:
    """The files a model needs: top level, ``PATTERNS``, never ``*.py``; safetensors win over
    pytorch_model*.bin, sharded model*.safetensors over consolidated*.safetensors, and HF weights
    over .gguf files (a GGUF repo's config.json is left out: the .gguf carries its own).

    Raises NotAModelRepo when there is no config.json and no .gguf (or a config without weights),
    and asks for ``include`` when several .gguf files would be fetched without a config.json.
    """
    chosen = [f for f in files if "/" not in f.path and not f.path.endswith((".py", ".pyc"))
              and any(fnmatch(f.path, p) for p in PATTERNS)
              and (not include or any(fnmatch(f.path, p) for p in include))]
    names = {f.path for f in chosen}
    if any(n.endswith(".safetensors") for n in names):
        chosen = [f for f in chosen if not fnmatch(f.path, "pytorch_model*.bin")]
    if any(fnmatch(n, "model*.safetensors") for n in names):
        chosen = [f for f in chosen if not fnmatch(f.path, "consolidated*.safetensors")]
    # the loader reads a folder with a config.json as HF format, never its .gguf files, and one without
    # as GGUF: HF weights make the .gguf files dead weight; without them, a GGUF repo's config.json
    # (many keep the original's) made its .gguf unloadable and hid that several were fetched
    if any(n.endswith((".safetensors", ".bin")) for n in names):
        chosen = [f for f in chosen if not f.path.endswith(".gguf")]
    elif any(n.endswith(".gguf") for n in names):
        chosen = [f for f in chosen if f.path != "config.json"]
    names = {f.path for f in chosen}
    ggufs = sorted(n for n in names if n.endswith(".gguf"))
    if "config.json" not in names and not ggufs:
        what = "the files matching --include" if include else repo_id
        raise NotAModelRepo(f"{repo_id}: not a model repo ({what} has no config.json and no .gguf file)")
    if "config.json" in names and not ggufs and not any(n.endswith((".safetensors", ".bin")) for n in names):
        raise NotAModelRepo(f"{repo_id}: has a config.json but no weights (*.safetensors or pytorch_model*.bin)")
    if "config.json" not in names and len(ggufs) > 1:
        shown = ", ".join(ggufs[:3]) + (f", … ({len(ggufs) - 3} more)" if len(ggufs) > 3 else "")
        raise DownloadError(f"{repo_id} has {len(ggufs)} .gguf files ({shown}): pick one with "
                            f"`specchat download {repo_id} --include FILE`")
    return sorted(chosen, key=lambda f: (f.size, f.path))  # config and tokenizer first, weights last


def plan(repo_id: str, revision: str | None = None, cache_dir: str | os.PathLike | None = None,
         include: Sequence[str] | None = None) -> Plan:
    """List the repo (network) and see what the cache already holds (complete files and partial blobs)."""
    rev = revision or DEFAULT_REVISION
    commit, files = list_files(repo_id, rev)
    p = Plan(repo_id, rev, commit, select_files(repo_id, files, include),
             Path(cache_dir) if cache_dir is not None else default_cache_dir())
    for f in p.files:
        p.present[f.path] = _bytes_present(p, f)
    return p


def _in_place(p: Plan, f: RepoFile) -> bool:
    """The file is downloaded: its snapshot entry or its blob has the listed size (a partial file of
    that size is not: a run killed before its checksum and rename left it, and it may be wrong)."""
    return any(done.is_file() and done.stat().st_size == f.size for done in (p.snapshot / f.path, p.blob_path(f)))


def _bytes_present(p: Plan, f: RepoFile) -> int:
    if _in_place(p, f):
        return f.size
    part = _incomplete(p.blob_path(f))
    size = part.stat().st_size if part.is_file() else 0
    return size if size <= f.size else 0


# model_type values engine.loading builds (its _families(); a test keeps the two equal): the
# downloader refuses the others after config.json, before the weights, without importing torch
MODEL_TYPES = ("llama", "mistral", "qwen2", "smollm2", "smollm3", "gpt_neox", "mamba", "mamba2", "granitemoehybrid")


def check_config(p: Plan, f: RepoFile) -> None:
    """Refuse a config.json the loader would refuse for its architecture (an unknown model_type, or
    one needing its own remote code) before gigabytes of weights come down. A config that is not
    readable JSON, or without a model_type and remote code, is left to the loader, which names what
    is wrong with it."""
    try:
        where = next(x for x in (p.blob_path(f), p.snapshot / f.path) if x.is_file())
        cfg = json.loads(where.read_bytes().decode("utf-8"))
    except (StopIteration, OSError, ValueError):
        return
    if not isinstance(cfg, dict):
        return
    mt = cfg.get("model_type")
    if mt in MODEL_TYPES or (mt is None and not cfg.get("auto_map")):
        return  # (no model_type: an original state-spaces/mamba checkpoint, or the loader's to judge)
    shown = repr(mt)[:60]  # the Hub's text
    if cfg.get("auto_map"):
        raise NotAModelRepo(f"{p.repo_id}: needs its own remote code (auto_map, model_type={shown}); specchat never runs "
                            "remote code, so its weights were not downloaded")
    raise NotAModelRepo(f"{p.repo_id}: unsupported architecture model_type={shown} (supported: {', '.join(sorted(MODEL_TYPES))}); "
                        "its weights were not downloaded")


def _incomplete(blob: Path) -> Path:
    return blob.with_name(blob.name + ".incomplete")  # huggingface_hub's own name: either tool resumes it


def check_disk_space(p: Plan) -> None:
    """Refuse before the first byte when the remaining files do not fit on the cache's disk."""
    where = p.cache_dir
    while not where.exists() and where.parent != where:
        where = where.parent
    free = shutil.disk_usage(where).free
    if p.needed > free:
        raise DiskSpaceError(f"not enough disk space to download {p.repo_id}: it needs {format_bytes(p.needed)}, "
                             f"only {format_bytes(free)} free in {p.cache_dir}")


# ---- downloading -------------------------------------------------------------------------------------
def download(repo_id: str, revision: str | None = None, cache_dir: str | os.PathLike | None = None, *,
             progress: ProgressCallback | None = None, cancel: threading.Event | None = None,
             include: Sequence[str] | None = None) -> Path:
    """Fetch (or resume, or just confirm) ``repo_id`` into the HF cache and return the snapshot dir.

    ``progress`` is called from this thread at most every PROGRESS_INTERVAL_S and at every file
    boundary; ``cancel`` is checked between chunks (DownloadCancelled, partial files kept), and
    a connection the server has gone quiet on is cut when it is set (:class:`_Watch`).
    """
    check_repo_id(repo_id)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        # huggingface_hub's offline switch: the cache only (it tried the network, then said "offline?")
        snap = cached_snapshot(repo_id, revision, cache)
        if snap is not None:
            return snap
        raise DownloadError(f"{repo_id} is not in the cache ({cache}) and HF_HUB_OFFLINE is set: "
                            "unset it to download, or copy the model into the cache")
    cancel = cancel or threading.Event()
    with _Watch(cancel):
        return _download(repo_id, revision, cache, progress, cancel, include)


def _download(repo_id: str, revision: str | None, cache: Path, progress: ProgressCallback | None,
              cancel: threading.Event, include: Sequence[str] | None) -> Path:
    try:
        try:
            p = plan(repo_id, revision, cache, include)
        except DownloadError:
            if cancel.is_set():  # the watch cut the listing's connection: that is not the Hub's failure
                raise DownloadCancelled(f"download of {repo_id} cancelled while listing its files; "
                                        "run it again to resume") from None
            raise
        check_disk_space(p)
        meter = _Meter(p, progress, cancel)
        meter.check_cancel()  # cancelled during the listing: so even where nothing is left to fetch
        for i, f in enumerate(p.files, start=1):
            meter.start_file(f, i)
            if not _in_place(p, f):  # a whole-sized partial file too: verified and renamed by _fetch
                _fetch(p, f, meter)
            if f.path == "config.json":  # small files come first: refused before the weights are fetched
                check_config(p, f)
            meter.end_file()
        for f in p.files:  # linked only once every blob is here: a snapshot folder holding config.json
            _link(p, f)  # is a whole model (a pinned commit has no ref to say so; a cancelled run linked it)
        if p.revision != p.commit:
            ref = p.storage / "refs" / p.revision
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(p.commit, encoding="utf-8")
    except OSError as e:  # the cache's disk: full, read-only, permissions
        raise DownloadError(f"cannot write {repo_id} into the cache {cache}: {e.strerror or e}; "
                            "fix that and run it again to resume") from None
    meter.finish()
    return p.snapshot


class _Meter:
    """Counts bytes, smooths the rate, throttles the callback, and owns the cancel check."""

    def __init__(self, p: Plan, callback: ProgressCallback | None, cancel: threading.Event) -> None:
        self.plan, self.callback, self.cancel = p, callback, cancel
        self.done = p.done
        self.file: RepoFile | None = None
        self.index = 0
        self.file_done = 0
        self.transferred = 0
        self.samples: deque[tuple[float, int]] = deque([(time.monotonic(), 0)])
        self.last_report = 0.0

    def start_file(self, f: RepoFile, index: int) -> None:
        self.file, self.index, self.file_done = f, index, self.plan.present[f.path]
        self._report(force=True)

    def set_file_done(self, n: int) -> None:
        """The partial file was restarted or rehashed from ``n`` bytes (no transfer counted)."""
        self.done += n - self.file_done
        self.file_done = n

    def add(self, n: int) -> None:
        self.file_done += n
        self.done += n
        self.transferred += n
        self._report()

    def check_cancel(self) -> None:
        if self.cancel.is_set():
            p = self.plan
            raise DownloadCancelled(f"download of {p.repo_id} cancelled: {format_bytes(self.done)} of "
                                    f"{format_bytes(p.total)} kept; run it again to resume")

    def end_file(self) -> None:
        self._report(force=True, file_complete=True)

    def finish(self) -> None:
        self._report(force=True, file_complete=True, finished=True)

    def rate(self) -> float:
        now = time.monotonic()
        self.samples.append((now, self.transferred))
        while len(self.samples) > 2 and now - self.samples[0][0] > RATE_WINDOW_S:
            self.samples.popleft()
        t0, b0 = self.samples[0]
        return (self.transferred - b0) / (now - t0) if now - t0 >= 0.2 else 0.0

    def _report(self, force: bool = False, file_complete: bool = False, finished: bool = False) -> None:
        now = time.monotonic()
        if self.callback is None or (not force and now - self.last_report < PROGRESS_INTERVAL_S):
            return
        self.last_report = now
        rate = self.rate()
        remaining = self.plan.total - self.done
        eta = remaining / rate if rate > 0 else (0.0 if remaining == 0 else None)
        f = self.file
        self.callback(Progress(self.plan.repo_id, f.path if f else "", self.index, len(self.plan.files),
                               self.file_done, f.size if f else 0, self.done, self.plan.total, rate, eta,
                               file_complete, finished))


@contextmanager
def _exclusive(p: Plan, f: RepoFile) -> Iterator[None]:
    """Hold huggingface_hub's own lock (.locks/<repo>/<blob>.lock, flock) while writing a blob, so
    two downloads (ours or hf's) never append to the same partial file."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locking
        yield
        return
    lock = p.cache_dir / ".locks" / repo_folder(p.repo_id) / f"{f.blob}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DownloadError(f"another download is writing {f.path} of {p.repo_id}; "
                                "wait for it to finish (or stop it) and run this again") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _fetch(p: Plan, f: RepoFile, meter: _Meter) -> None:
    """Transfer one file into blobs/<id>.incomplete (resuming it), verify it, rename it to the blob."""
    with _exclusive(p, f):
        _fetch_locked(p, f, meter)


def _fetch_locked(p: Plan, f: RepoFile, meter: _Meter) -> None:
    blob = p.blob_path(f)
    if blob.is_file() and blob.stat().st_size == f.size:  # the other download finished it meanwhile
        return
    part = _incomplete(blob)
    part.parent.mkdir(parents=True, exist_ok=True)
    url = f"{endpoint()}/{p.repo_id}/resolve/{p.commit}/{urllib.parse.quote(f.path)}"
    hasher = _Hasher(f)
    for attempt in range(1, ATTEMPTS + 1):
        meter.check_cancel()
        start = part.stat().st_size if part.exists() else 0
        if start > f.size:
            part.unlink()
            start = 0
        hasher.catch_up(part, start)
        meter.set_file_done(start)
        if start == f.size:
            break
        try:
            _transfer(p, f, url, part, start, hasher, meter)
            break
        except _Dropped as e:
            if attempt == ATTEMPTS:
                raise DownloadError(f"connection to the Hub lost while downloading {f.path} of {p.repo_id} "
                                    f"({format_bytes(meter.file_done)} of {format_bytes(f.size)}: {e}); "
                                    "run it again to resume") from None
            meter.cancel.wait(0.2 * attempt)  # (checked at the top of the next attempt)
    if part.stat().st_size > f.size:  # the file and the listing disagree: a rerun would fetch the same again
        part.unlink()
        raise DownloadError(f"{p.repo_id}: the server sent more than the {f.size} bytes its listing gives for {f.path} "
                            "(a mirror out of step with its listing?); nothing of it kept")
    if part.stat().st_size != f.size:
        raise DownloadError(f"{p.repo_id}: {f.path} has {part.stat().st_size} bytes, the listing says {f.size}; run it again")
    if not hasher.matches():
        part.unlink()
        raise DownloadError(f"{p.repo_id}: {f.path} failed its checksum (corrupt transfer); run it again to download it afresh")
    os.replace(part, blob)


class _Dropped(Exception):
    """The connection broke after it was established: worth resuming with a Range request."""


def _transfer(p: Plan, f: RepoFile, url: str, part: Path, start: int, hasher: "_Hasher", meter: _Meter) -> None:
    headers = {"Range": f"bytes={start}-"} if start else {}
    try:
        resp = _open(_request(url, headers), _timeout("HF_HUB_DOWNLOAD_TIMEOUT"), p.repo_id, p.revision, f.path)
    except HubUnreachable as e:
        meter.check_cancel()  # the watch cut the connection while it waited for the headers
        if start or meter.transferred:  # the Hub answered a moment ago: a blip, try to resume
            raise _Dropped(e.reason) from None
        raise
    with resp:
        mode = "ab"
        if start and resp.status != 206:  # the server ignored the Range: start over
            mode, start = "wb", 0
            hasher.reset()
            meter.set_file_done(0)
        elif start and not (resp.headers.get("Content-Range") or "").startswith(f"bytes {start}-"):
            raise DownloadError(f"{p.repo_id}: the server resumed {f.path} at the wrong offset; delete {part} and retry")
        with open(part, mode) as out:  # an OSError here is the disk's: download() reports it
            while True:
                meter.check_cancel()
                try:
                    chunk = resp.read1(CHUNK)
                except (http.client.HTTPException, OSError) as e:  # reset, timeout, TLS: the network's
                    meter.check_cancel()  # (or the watch's cut)
                    raise _Dropped(_reason(e)) from None
                if not chunk:
                    meter.check_cancel()  # the watch's cut reads as the end of the body
                    break
                out.write(chunk)
                hasher.update(chunk)
                meter.add(len(chunk))
    if part.stat().st_size < f.size:
        raise _Dropped("the server closed the connection early")


class _Hasher:
    """sha256 (LFS) or git's blob sha1 of the bytes written so far; resumes by rehashing the prefix."""

    def __init__(self, f: RepoFile) -> None:
        self.f = f
        self.reset()

    def reset(self) -> None:
        self.pos = 0
        if self.f.sha256:
            self.h = hashlib.sha256()
        else:
            self.h = hashlib.sha1(usedforsecurity=False)
            self.h.update(b"blob %d\0" % self.f.size)

    def update(self, chunk: bytes) -> None:
        self.h.update(chunk)
        self.pos += len(chunk)

    def catch_up(self, part: Path, start: int) -> None:
        """Hash the first ``start`` bytes of ``part`` unless they are already in."""
        if self.pos == start:
            return
        self.reset()
        with open(part, "rb") as fh:
            while self.pos < start:
                chunk = fh.read(min(CHUNK, start - self.pos))
                if not chunk:
                    break
                self.update(chunk)

    def matches(self) -> bool:
        want = self.f.sha256 or self.f.git_oid
        return want is None or self.h.hexdigest() == want


def _link(p: Plan, f: RepoFile) -> None:
    """snapshots/<commit>/<file> -> ../../blobs/<id> (a move when the disk has no symlinks)."""
    dst = p.snapshot / f.path
    blob = p.blob_path(f)
    if dst.is_file() and dst.stat().st_size == f.size:
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    try:
        os.symlink(os.path.relpath(blob, dst.parent), dst)
    except OSError:
        os.replace(blob, dst)


# ---- formatting (shared by the CLI line and the UI labels) ------------------------------------------
def format_bytes(n: float) -> str:
    """Decimal units as the Hub shows sizes: ``999 B``, ``1.5 kB``, ``269.1 MB``, ``14.5 GB``."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def format_duration(seconds: float | None) -> str:
    """At most two units: ``7s``, ``1m10s``, ``2h05m``; ``99h+`` beyond; ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s >= 100 * 3600:
        return "99h+"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def format_rate(p: Progress) -> str:
    """``12.3 MB/s · ETA 42s`` (blank while nothing is measured, ``done`` at the end)."""
    if p.finished:
        return "done"
    if p.rate <= 0:
        return ""
    return f"{format_bytes(p.rate)}/s · ETA {format_duration(p.eta_s)}"


def progress_line(p: Progress) -> str:
    """``[2/7] model.safetensors 45% 120.0 MB/269.1 MB · total 46% 130.2 MB/280.0 MB · 12.3 MB/s · ETA 12s``"""
    pct = int(100 * p.file_done / p.file_total) if p.file_total else 100
    line = (f"[{p.file_index}/{p.file_count}] {p.file} {pct}% {format_bytes(p.file_done)}/{format_bytes(p.file_total)}"
            f" · total {int(100 * p.fraction)}% {format_bytes(p.done)}/{format_bytes(p.total)}")
    rate = format_rate(p)
    return f"{line} · {rate}" if rate else line


class TerminalProgress:
    """A :data:`ProgressCallback` for the CLI: on a terminal one line per file, updated in place
    (``\\r``), kept when the file is done; elsewhere (logs, pipes) just the finished lines."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.open_line = False

    def __call__(self, p: Progress) -> None:
        if p.finished:
            self._write(f"{p.repo_id}: {format_bytes(p.total)} in {p.file_count} file(s), all in place", end=True)
        elif p.file_complete:
            self._write(progress_line(p), end=True)
        elif self.tty:
            self._write(progress_line(p), end=False)

    def _write(self, line: str, end: bool) -> None:
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            line = "\r\x1b[K" + (line if len(line) <= width else line[:width - 1] + "…")
        self.stream.write(line + ("\n" if end else ""))
        self.stream.flush()
        self.open_line = not end

    def close(self) -> None:
        """End a line left open by an interrupted file (so the next message starts on its own line)."""
        if self.open_line:
            self.stream.write("\n")
            self.stream.flush()
            self.open_line = False
