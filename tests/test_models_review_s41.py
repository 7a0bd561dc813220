"""Review of in-app model choosing and downloading (engine/hub.py): defects found and fixed.

Every test here failed before its fix; each runs against the local fake Hub (tests/fakehub.py).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from engine import hub

from .fakehub import FakeHub

WEIGHTS = os.urandom(200_000)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    with FakeHub() as fh:
        fh.use(monkeypatch, tmp_path)
        monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "5")
        yield fh


def cancel_in_weights(fake: FakeHub, repo_id: str, revision: str | None = None) -> None:
    """Download ``repo_id`` and cancel it once the weights have started (partial file kept)."""
    fake.delay_s, fake.chunk = 0.005, 4096
    cancel = threading.Event()

    def progress(p: hub.Progress) -> None:
        if p.file.endswith(".safetensors") and p.file_done > 10_000:
            cancel.set()

    with pytest.raises(hub.DownloadCancelled):
        hub.download(repo_id, revision, progress=progress, cancel=cancel)
    fake.delay_s = 0.0


# ---- a cancelled download of a pinned commit looked downloaded ------------------------------------------
def test_a_cancelled_download_of_a_pinned_commit_is_not_cached(fake: FakeHub) -> None:
    """models.toml may pin ``revision = "<commit>"``: no ref is written for a commit, so the
    snapshot folder is all there is. config.json (small files come first) was linked into it as
    soon as it arrived: a cancelled download then counted as cached, the picker loaded it (and
    the load failed on the missing weights), and nothing in the picker could download the rest."""
    repo = fake.add_repo("org/pinned", {"config.json": b'{"model_type": "llama"}', "model.safetensors": WEIGHTS})
    cancel_in_weights(fake, "org/pinned", repo.commit)
    assert hub.cached_snapshot("org/pinned", repo.commit) is None
    assert hub.has_partial("org/pinned")
    snap = hub.download("org/pinned", repo.commit)  # resumes; then it is whole
    assert hub.cached_snapshot("org/pinned", repo.commit) == snap
    assert (snap / "model.safetensors").read_bytes() == WEIGHTS


# ---- what the loader refuses is refused before gigabytes come down ----------------------------------------
@pytest.mark.parametrize("config, message", [
    ({"model_type": "bert"}, "model_type='bert'"),
    ({"model_type": "custom_lm", "auto_map": {"AutoModelForCausalLM": "modeling_custom.CustomLM"}}, "remote code"),
    ({"architectures": ["Custom"], "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"}}, "remote code"),
])
def test_an_architecture_the_loader_refuses_is_refused_before_the_weights(fake: FakeHub, config: dict, message: str) -> None:
    fake.add_repo("org/odd-arch", {"config.json": json.dumps(config).encode(), "model.safetensors": WEIGHTS,
                                   "modeling_custom.py": b"import os; os.system('echo pwned')"})
    with pytest.raises(hub.DownloadError) as err:
        hub.download("org/odd-arch")
    text = str(err.value)
    assert "\n" not in text and message in text and "org/odd-arch" in text
    assert "model.safetensors" not in fake.file_requests() and "modeling_custom.py" not in fake.file_requests()
    assert hub.cached_snapshot("org/odd-arch") is None


def test_the_architectures_the_downloader_accepts_are_the_loaders() -> None:
    from engine.loading import _families

    assert set(hub.MODEL_TYPES) == set(_families())


# ---- a download huggingface_hub left half done looked downloaded ---------------------------------------------
def test_a_snapshot_without_its_weights_is_not_cached(fake: FakeHub, tmp_path: Path) -> None:
    """`hf download` (huggingface_hub, whose cache this is) writes refs/main before the files and links
    each file as it lands: stopped during the weights, it leaves a ref and a config.json beside no
    weights. That counted as cached: the picker offered it as ready, the load failed on the missing
    weights, and the picker could never download the rest (nor could `load` ask for it)."""
    fake.add_repo("org/half", {"config.json": b'{"model_type": "llama"}', "model-00001-of-00002.safetensors": WEIGHTS,
                               "model-00002-of-00002.safetensors": WEIGHTS[::-1],
                               "model.safetensors.index.json": json.dumps({"weight_map": {
                                   "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}).encode()})
    snap = hub.download("org/half")
    assert hub.cached_snapshot("org/half") == snap
    second = snap / "model-00002-of-00002.safetensors"
    blob = second.resolve()
    blob.rename(blob.with_name(blob.name + ".incomplete"))  # what hf leaves: the link, its blob still partial
    assert hub.cached_snapshot("org/half") is None
    (snap / "model-00001-of-00002.safetensors").resolve().unlink()
    second.unlink()  # hf links a file only once it is whole
    assert hub.cached_snapshot("org/half") is None
    (snap / "model.safetensors.index.json").unlink()
    assert hub.cached_snapshot("org/half") is None  # config.json alone
    assert hub.has_partial("org/half")
    assert hub.download("org/half") == snap and hub.cached_snapshot("org/half") == snap  # resumed and whole again
    assert second.read_bytes() == WEIGHTS[::-1]


# ---- GGUF repos that ship a config.json -------------------------------------------------------------------
def test_a_gguf_repo_with_a_config_json_still_asks_which_gguf(fake: FakeHub) -> None:
    """Many GGUF repos keep the original config.json beside a dozen quantisations: with a config.json
    there, every .gguf was fetched (tens of GB) into a folder the loader then read as HF format
    (config.json present) and refused for having no weights."""
    fake.add_repo("org/quants", {"config.json": b'{"model_type": "llama"}', "a.Q4_0.gguf": b"g" * 3000,
                                 "a.Q8_0.gguf": b"g" * 5000})
    with pytest.raises(hub.DownloadError) as err:
        hub.download("org/quants")
    assert "--include" in str(err.value) and fake.file_requests() == []


def test_a_gguf_repo_with_a_config_json_downloads_a_loadable_gguf(fake: FakeHub, make_tiny_gguf) -> None:
    from engine.loading import load

    gguf_path, _, _ = make_tiny_gguf("llama")
    fake.add_repo("org/one-gguf", {"config.json": b'{"model_type": "llama"}', "tiny.gguf": gguf_path.read_bytes()})
    snap = hub.download("org/one-gguf")
    assert [p.name for p in snap.iterdir()] == ["tiny.gguf"]
    assert load(str(snap)).fmt == "gguf"


def test_ggufs_beside_safetensors_are_not_fetched(fake: FakeHub) -> None:
    fake.add_repo("org/both", {"config.json": b'{"model_type": "llama"}', "model.safetensors": WEIGHTS,
                               "a.Q4_0.gguf": b"g" * 3000, "a.Q8_0.gguf": b"g" * 5000})
    snap = hub.download("org/both")
    assert sorted(p.name for p in snap.iterdir()) == ["config.json", "model.safetensors"]
    assert not any(n.endswith(".gguf") for n in fake.file_requests())


# ---- a cancel during the listing ----------------------------------------------------------------------------
def test_a_cancel_during_the_listing_cancels_even_when_nothing_is_left_to_fetch(fake: FakeHub, monkeypatch: pytest.MonkeyPatch,
                                                                             tmp_path: Path) -> None:
    """Esc while the picker says "listing files…": the cancel was first checked before a file's
    transfer, so where every file was already there (blobs without a ref, as for the picker's
    "not downloaded" rows then) the download finished, and the picker closed and switched model
    after the user had cancelled."""
    fake.add_repo("org/there", {"config.json": b'{"model_type": "llama"}', "model.safetensors": WEIGHTS})
    hub.download("org/there")
    (tmp_path / "cache" / "models--org--there" / "refs" / "main").unlink()
    assert hub.cached_snapshot("org/there") is None
    cancel = threading.Event()
    real_plan = hub.plan

    def plan(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - hub.plan's signature
        p = real_plan(*args, **kwargs)
        cancel.set()  # the user pressed Esc while the listing came
        return p

    monkeypatch.setattr(hub, "plan", plan)
    with pytest.raises(hub.DownloadCancelled):
        hub.download("org/there", cancel=cancel)
    assert hub.cached_snapshot("org/there") is None
