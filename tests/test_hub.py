"""engine.hub and `specchat download` against a local fake Hub (tests/fakehub.py): never the real one."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import namedtuple
from pathlib import Path

import pytest

from engine import hub
from engine.cli import main

from .fakehub import FakeHub

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = os.urandom(300_000)
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer.json": b'{"model": {}}',
    "model.safetensors": WEIGHTS,
    "pytorch_model.bin": b"p" * 5000,  # safetensors win: never fetched
    "modeling_custom.py": b"import os; os.system('echo pwned')",  # remote code: never fetched
    "README.md": b"# tiny",
    "onnx/model.json": b"{}",  # not top level: never fetched
}
WANTED = {"config.json", "tokenizer.json", "model.safetensors"}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A running FakeHub with org/tiny; HF_ENDPOINT and the HF cache point at it and at tmp_path."""
    with FakeHub() as fh:
        fh.add_repo("org/tiny", FILES)
        monkeypatch.setenv("HF_ENDPOINT", fh.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "5")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield fh


def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def partial_files(tmp_path: Path) -> list[Path]:
    return sorted(cache(tmp_path).rglob("*.incomplete"))


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text
    return text


# ---- success, layout, progress ---------------------------------------------------------------------
def test_download_fills_the_hf_cache_layout_and_reports_progress(fake: FakeHub, tmp_path: Path) -> None:
    reports: list[hub.Progress] = []
    snap = hub.download("org/tiny", progress=reports.append)

    repo = fake.repos["org/tiny"]
    storage = cache(tmp_path) / "models--org--tiny"
    assert snap == storage / "snapshots" / repo.commit
    assert {p.name for p in snap.iterdir()} == WANTED
    for name in WANTED:
        assert (snap / name).read_bytes() == FILES[name]
        assert (snap / name).is_symlink() and (snap / name).resolve().parent == storage / "blobs"
    assert (storage / "blobs" / hashlib.sha256(WEIGHTS).hexdigest()).is_file()  # LFS blobs are named by sha256
    assert (storage / "refs" / "main").read_text() == repo.commit
    assert not partial_files(tmp_path)

    assert set(fake.file_requests()) == WANTED  # no *.py, no README, no subfolders, no .bin next to safetensors
    total = sum(len(FILES[n]) for n in WANTED)
    assert all(r.total == total and r.file_count == 3 for r in reports)
    assert [r.done for r in reports] == sorted(r.done for r in reports)
    assert reports[-1].finished and reports[-1].done == total
    done_files = [r.file for r in reports if r.file_complete and not r.finished]
    assert done_files == ["tokenizer.json", "config.json", "model.safetensors"]  # small files first, weights last
    assert hub.cached_snapshot("org/tiny") == snap


def test_resolve_finds_the_downloaded_hub_id_and_a_gguf_loads(fake: FakeHub, tmp_path: Path, make_tiny_gguf,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    from engine.loading import load, resolve

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache(tmp_path)))  # read at its import
    gguf_path, _, _ = make_tiny_gguf("llama")
    fake.add_repo("org/tiny-gguf", {"tiny.gguf": gguf_path.read_bytes(), "README.md": b"x"})
    snap = hub.download("org/tiny-gguf")
    hub.download("org/tiny")

    assert resolve("org/tiny") == ("org/tiny", cache(tmp_path) / "models--org--tiny" / "snapshots" / fake.repos["org/tiny"].commit)
    assert resolve("org/tiny-gguf")[1] == snap
    loaded = load("org/tiny-gguf")
    assert loaded.fmt == "gguf" and loaded.path.parent == snap


def test_a_second_download_fetches_nothing(fake: FakeHub) -> None:
    first = hub.download("org/tiny")
    fake.requests.clear()
    reports: list[hub.Progress] = []
    assert hub.download("org/tiny", progress=reports.append) == first
    assert fake.file_requests() == []
    assert reports[-1].finished and reports[-1].done == reports[-1].total


def test_include_narrows_the_files_but_never_fetches_python(fake: FakeHub) -> None:
    snap = hub.download("org/tiny", include=["*.json", "*.safetensors", "*.py"])
    assert {p.name for p in snap.iterdir()} == WANTED
    assert not any(name.endswith(".py") for name in fake.file_requests())


def test_revision_names_a_branch_and_refs_records_its_commit(fake: FakeHub, tmp_path: Path) -> None:
    repo = fake.add_repo("org/branchy", {"config.json": b"{}", "model.safetensors": b"w" * 2000}, branch="v1")
    snap = hub.download("org/branchy", revision="v1")
    assert snap.name == repo.commit
    assert (cache(tmp_path) / "models--org--branchy" / "refs" / "v1").read_text() == repo.commit
    assert hub.cached_snapshot("org/branchy", "v1") == snap and hub.cached_snapshot("org/branchy") is None


# ---- resume ----------------------------------------------------------------------------------------
def test_a_dropped_connection_is_resumed_in_the_same_run(fake: FakeHub) -> None:
    fake.drop_after, fake.drops = 100_000, 1
    snap = hub.download("org/tiny")
    assert (snap / "model.safetensors").read_bytes() == WEIGHTS
    assert fake.bytes_sent["org/tiny/model.safetensors"] == len(WEIGHTS)  # nothing sent twice
    assert ("/org/tiny/resolve/" + fake.repos["org/tiny"].commit + "/model.safetensors", "bytes=100000-") in fake.requests


def test_a_broken_transfer_fails_in_one_line_and_the_next_run_resumes(fake: FakeHub, tmp_path: Path) -> None:
    fake.drop_after, fake.drops = 50_000, hub.ATTEMPTS  # every attempt of this run breaks
    with pytest.raises(hub.DownloadError) as err:
        hub.download("org/tiny")
    msg = one_line(err.value)
    assert "connection to the Hub lost" in msg and "model.safetensors" in msg and "resume" in msg
    (part,) = partial_files(tmp_path)
    kept = part.stat().st_size
    assert kept == 50_000 * hub.ATTEMPTS
    assert hub.cached_snapshot("org/tiny") is None  # refs are written only for whole snapshots
    assert hub.has_partial("org/tiny")

    sent_before = fake.bytes_sent["org/tiny/model.safetensors"]
    snap = hub.download("org/tiny")
    assert (snap / "model.safetensors").read_bytes() == WEIGHTS
    assert fake.bytes_sent["org/tiny/model.safetensors"] - sent_before == len(WEIGHTS) - kept
    assert fake.bytes_sent["org/tiny/model.safetensors"] == len(WEIGHTS)
    assert not partial_files(tmp_path) and not hub.has_partial("org/tiny")


def test_cancel_mid_file_keeps_the_partial_file_and_a_rerun_resumes_it(fake: FakeHub, tmp_path: Path) -> None:
    fake.delay_s, fake.chunk = 0.01, 4096
    cancel = threading.Event()

    def progress(p: hub.Progress) -> None:
        if p.file == "model.safetensors" and p.file_done > 20_000:
            cancel.set()

    with pytest.raises(hub.DownloadCancelled) as err:
        hub.download("org/tiny", progress=progress, cancel=cancel)
    msg = one_line(err.value)
    assert "cancelled" in msg and "kept" in msg and "resume" in msg
    (part,) = partial_files(tmp_path)
    kept = part.stat().st_size
    assert 20_000 < kept < len(WEIGHTS)
    assert part.read_bytes() == WEIGHTS[:kept]

    fake.delay_s = 0.0
    fake.requests.clear()
    snap = hub.download("org/tiny")
    assert (snap / "model.safetensors").read_bytes() == WEIGHTS
    assert [r for _, r in fake.requests if r] == [f"bytes={kept}-"]  # only the missing tail was asked for


def test_a_server_that_ignores_range_restarts_the_file_cleanly(fake: FakeHub, tmp_path: Path) -> None:
    fake.drop_after, fake.drops = 50_000, hub.ATTEMPTS
    with pytest.raises(hub.DownloadError):
        hub.download("org/tiny")
    fake.ranges = False
    snap = hub.download("org/tiny")
    assert (snap / "model.safetensors").read_bytes() == WEIGHTS


def test_a_second_download_of_the_same_file_waits_its_turn(fake: FakeHub, tmp_path: Path) -> None:
    fcntl = pytest.importorskip("fcntl")
    blob = hashlib.sha256(WEIGHTS).hexdigest()
    lock = cache(tmp_path) / ".locks" / "models--org--tiny" / f"{blob}.lock"  # huggingface_hub's lock file
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(hub.DownloadError) as err:
            hub.download("org/tiny")
    assert "another download is writing model.safetensors" in one_line(err.value)
    assert "model.safetensors" not in fake.file_requests()
    assert (hub.download("org/tiny") / "model.safetensors").read_bytes() == WEIGHTS  # once it is released


def test_a_corrupt_transfer_fails_its_checksum_and_is_not_kept(fake: FakeHub, tmp_path: Path) -> None:
    repo = fake.repos["org/tiny"]
    honest = repo.sibling
    repo.sibling = lambda path: {**honest(path), **({"lfs": {"sha256": "0" * 64, "size": len(WEIGHTS)}}
                                                   if path == "model.safetensors" else {})}  # type: ignore[method-assign]
    with pytest.raises(hub.DownloadError) as err:
        hub.download("org/tiny")
    assert "checksum" in one_line(err.value)
    assert not partial_files(tmp_path)
    assert not (cache(tmp_path) / "models--org--tiny" / "blobs" / ("0" * 64)).exists()


# ---- refusals and failures -----------------------------------------------------------------------------
def test_disk_space_is_checked_before_the_first_byte(fake: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(hub.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(hub.DiskSpaceError) as err:
        hub.download("org/tiny")
    msg = one_line(err.value)
    total = sum(len(FILES[n]) for n in WANTED)
    assert f"needs {hub.format_bytes(total)}" in msg and "1.0 kB free" in msg
    assert fake.file_requests() == []


def test_offline_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache(tmp_path)))
    with pytest.raises(hub.HubUnreachable) as err:
        hub.download("org/tiny")
    msg = one_line(err.value)
    assert "cannot reach the Hugging Face Hub" in msg and "connection refused" in msg and "resume" in msg
    assert hub._reason(socket.gaierror(-2, "Name or service not known")) == "host name not found"


def test_gated_repo_asks_for_a_login(fake: FakeHub, tmp_path: Path) -> None:
    fake.add_repo("org/gated", {"config.json": b"{}", "model.safetensors": b"w" * 4000}, gated=True)
    with pytest.raises(hub.GatedRepo) as err:
        hub.download("org/gated")
    msg = one_line(err.value)
    assert "gated" in msg and "HF_TOKEN" in msg and f"{fake.url}/org/gated" in msg
    assert not list(cache(tmp_path).rglob("snapshots/*/*"))


@pytest.mark.parametrize("status", [404, 401])  # anonymous callers get 401 + RepoNotFound from the real Hub
def test_missing_repo(fake: FakeHub, status: int) -> None:
    fake.missing_status = status
    with pytest.raises(hub.RepoNotFound) as err:
        hub.download("org/nope")
    assert "org/nope: no such model on the Hub" in one_line(err.value)


def test_missing_revision(fake: FakeHub) -> None:
    with pytest.raises(hub.RevisionNotFound) as err:
        hub.download("org/tiny", revision="v9")
    assert one_line(err.value) == "org/tiny: revision 'v9' not found on the Hub"


@pytest.mark.parametrize("files, message", [
    ({"README.md": b"hi", "train.py": b"x"}, "not a model repo"),
    ({"config.json": b"{}", "tokenizer.json": b"{}"}, "no weights"),
    ({"a.Q4_0.gguf": b"g" * 10, "a.Q8_0.gguf": b"g" * 20}, "--include"),
])
def test_partial_repos_are_refused_before_downloading(fake: FakeHub, files: dict[str, bytes], message: str) -> None:
    fake.add_repo("org/odd", files)
    with pytest.raises(hub.DownloadError) as err:
        hub.download("org/odd")
    assert message in one_line(err.value)
    assert fake.file_requests() == []


def test_one_of_several_ggufs_with_include(fake: FakeHub) -> None:
    fake.add_repo("org/quants", {"a.Q4_0.gguf": b"g" * 10, "a.Q8_0.gguf": b"g" * 20})
    snap = hub.download("org/quants", include=["*Q8_0*"])
    assert [p.name for p in snap.iterdir()] == ["a.Q8_0.gguf"] and fake.file_requests() == ["a.Q8_0.gguf"]


@pytest.mark.parametrize("name", ["../evil.json", "/etc/evil.json", "sub/../../evil.json", "..\\evil.json", "C:evil.json"])
def test_path_traversal_names_are_refused(fake: FakeHub, tmp_path: Path, name: str) -> None:
    fake.repos["org/tiny"].extra_siblings.append({"rfilename": name, "size": 3, "blobId": "a" * 40})
    with pytest.raises(hub.UnsafeFileName) as err:
        hub.download("org/tiny")
    assert "refusing unsafe file name" in one_line(err.value)
    assert fake.file_requests() == []
    assert not (tmp_path / "evil.json").exists() and not (cache(tmp_path) / "evil.json").exists()


@pytest.mark.parametrize("bad", ["no-slash", "../x/y", "a/..", "org/name/extra", ""])
def test_bad_repo_ids_are_refused(bad: str) -> None:
    with pytest.raises(hub.DownloadError):
        hub.download(bad)


def test_the_token_goes_to_the_endpoint_only() -> None:
    import urllib.request

    req = urllib.request.Request("http://hub.example/a", headers={"Authorization": "Bearer t"})
    handler = hub._AuthOnSameHost()
    same = handler.redirect_request(req, None, 302, "Found", {}, "http://hub.example/b")
    other = handler.redirect_request(req, None, 302, "Found", {}, "http://cdn.example/blob")
    assert same.get_header("Authorization") == "Bearer t"
    assert other.get_header("Authorization") is None


def test_formatting() -> None:
    assert [hub.format_bytes(n) for n in (0, 999, 1500, 269_100_000, 14.5e9)] == ["0 B", "999 B", "1.5 kB", "269.1 MB", "14.5 GB"]
    assert [hub.format_duration(s) for s in (None, 7, 70, 7260, 400_000)] == ["?", "7s", "1m10s", "2h01m", "99h+"]
    p = hub.Progress("org/m", "model.safetensors", 2, 7, 120_000_000, 269_100_000, 130_200_000, 280_000_000,
                     rate=12_300_000, eta_s=12)
    assert hub.progress_line(p) == ("[2/7] model.safetensors 44% 120.0 MB/269.1 MB · total 46% 130.2 MB/280.0 MB"
                                    " · 12.3 MB/s · ETA 12s")


# ---- the CLI -----------------------------------------------------------------------------------------
def test_cli_download_prints_progress_and_the_path(fake: FakeHub, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["download", "org/tiny"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"org/tiny -> {cache(tmp_path) / 'models--org--tiny' / 'snapshots' / fake.repos['org/tiny'].commit}"
    lines = err.strip().splitlines()
    assert "[3/3] model.safetensors 100% 300.0 kB/300.0 kB · total 100%" in lines[-2]
    assert lines[-1].startswith("org/tiny: ") and "3 file(s)" in lines[-1]


def test_cli_download_takes_a_models_toml_name(fake: FakeHub, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    models = tmp_path / "models.toml"
    models.write_text('[[model]]\nname = "tiny"\nhub_id = "org/tiny"\nrole = ["target"]\n')
    assert main(["download", "tiny", "--models", str(models)]) == 0
    assert capsys.readouterr().out.startswith("org/tiny -> ")


@pytest.mark.parametrize("ref, message", [
    ("org/nope", "no such model on the Hub"),
    ("org/gated", "is gated"),
    ("org/odd", "not a model repo"),
    ("not-a-ref", "neither a models.toml name"),
])
def test_cli_download_errors_are_one_line_exit_2(fake: FakeHub, capsys: pytest.CaptureFixture[str], ref: str, message: str) -> None:
    fake.add_repo("org/gated", {"config.json": b"{}", "model.safetensors": b"w"}, gated=True)
    fake.add_repo("org/odd", {"README.md": b"hi"})
    assert main(["download", ref]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("specchat: error: ") and message in err


def test_cli_ctrl_c_cancels_keeps_the_partial_and_a_rerun_resumes(fake: FakeHub, tmp_path: Path) -> None:
    fake.delay_s, fake.chunk = 0.1, 4096  # ~7 s for the weights: the signal lands mid-transfer even on a loaded machine
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "download", "org/tiny"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # see test_cli._default_sigint
    deadline = time.monotonic() + 30
    while fake.bytes_sent["org/tiny/model.safetensors"] < 30_000:
        assert proc.poll() is None and time.monotonic() < deadline, "the download never started"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and out == ""
    assert err.strip().splitlines()[-1].startswith("specchat: download of org/tiny cancelled: ")
    assert "run it again to resume" in err
    (part,) = partial_files(tmp_path)
    assert 0 < part.stat().st_size < len(WEIGHTS)

    fake.delay_s = 0.0
    done = subprocess.run([sys.executable, "-m", "engine.cli", "download", "org/tiny"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert any(r.startswith("bytes=") for _, r in fake.requests)
    snap = Path(done.stdout.strip().split(" -> ")[1])
    assert (snap / "model.safetensors").read_bytes() == WEIGHTS
