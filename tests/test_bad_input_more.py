"""Bad input the audit of session 40 found mishandled: each is one clear line (exit 2), or for Ctrl-C
and a closed pipe a clean stop, and nothing the user had is lost.

    - a drafter whose vocabulary is smaller than the target's, without tokenizers to bridge them
    - a chat template that fails while rendering (raise_exception, an undefined name, a bug)
    - a chat_template.jinja that is not UTF-8 (the error named tokenizer.json)
    - `specchat generate ... | head` (BrokenPipeError)
    - Ctrl-C in `bench` (every measured row was lost)
    - `bench --verify-cost` / `--tree-scaling` with --models (the file was ignored)
    - `distill data --prompts /dev/zero` (read without a bound)
    - a Hub listing with malformed entries, an HF_ENDPOINT that is not an http(s) URL, timeouts
      that are not positive numbers
    - a complete-sized partial file left by a killed download (linked as done, never verified)
    - a server that sends more bytes than its listing says (every rerun failed the same way)
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import hub
from engine.cli import main
from engine.tokenizer import ByteTokenizer

from .fakehub import FakeHub, FakeRepo
from .test_hardening import cli_error
from .test_cli_input_errors import run
from .tiny import saved

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Tiny checkpoints: ``small`` (vocab 96) and ``long`` (vocab 260) without tokenizers, and
    ``chat``: ``long`` with a byte-level tokenizer (259 tokens)."""
    root = tmp_path_factory.mktemp("badinput_s40")
    small, long = saved("llama", str(root)), saved("long", str(root))
    chat = root / "chat"
    shutil.copytree(long, chat)
    ByteTokenizer().save(chat)
    return {"small": small, "long": long, "chat": chat}


def with_template(src: Path, dst: Path, template) -> Path:
    shutil.copytree(src, dst)
    cfg_path = dst / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = template
    cfg_path.write_text(json.dumps(cfg))
    return dst


# ---- models.toml: a pairing given twice ------------------------------------------------------------
def test_a_pairing_given_twice_is_refused(tmp_path, capsys):
    """The second [[pairing]] of the same target and drafter (another strategy, say) was ignored
    without a word: the first one's was used."""
    toml = tmp_path / "models.toml"
    toml.write_text('[[model]]\nname = "t"\nhub_id = "a/t"\n[[model]]\nname = "d"\nhub_id = "a/d"\n'
                    '[[pairing]]\ntarget = "t"\ndrafter = "d"\nstrategy = "sd:4"\n'
                    '[[pairing]]\ntarget = "t"\ndrafter = "d"\nstrategy = "sd:6"\n')
    err = cli_error(capsys, "models", "--models", str(toml))
    assert f"{toml}: [[pairing]] #2 repeats the pairing of target 't' with drafter 'd' (#1)" in err, err
    # the shipped registry has none
    code, _, err = run(capsys, "models", "--models", str(REPO / "models.toml"))
    assert code == 0, err


# ---- a drafter that cannot read the target's ids ---------------------------------------------------
def test_a_drafter_with_a_smaller_vocabulary_and_no_tokenizers_is_refused(models, tmp_path, capsys):
    """The drafter embedded the target's ids: an id past its vocabulary was an IndexError mid-reply."""
    common = ["--prompt-ids", "1,2", "--max-new-tokens", "8", "--strategy", "sd:4", "--dtype", "fp32"]
    err = cli_error(capsys, "generate", "--target", str(models["long"]), "--drafter", str(models["small"]), *common)
    assert "drafter llama-0 has 96 token ids and target long-0 260" in err and "tokenizer" in err, err
    # a larger drafter vocabulary is fine (its extra columns are cut), as before
    code, _, err = run(capsys, "generate", "--target", str(models["small"]), "--drafter", str(models["long"]), *common)
    assert code == 0, err
    # the registry's pairing: the target decodes alone, with a warning
    toml = tmp_path / "models.toml"
    toml.write_text(f'[[model]]\nname = "t"\nlocal = "{models["long"]}"\ndefault = true\n'
                    f'[[model]]\nname = "d"\nlocal = "{models["small"]}"\n'
                    '[[pairing]]\ntarget = "t"\ndrafter = "d"\ndefault = true\n')
    code, out, err = run(capsys, "generate", "--models", str(toml), "--prompt-ids", "1,2", "--max-new-tokens", "30",
                         "--json", "--dtype", "fp32")
    assert code == 0 and "the paired drafter 'd' was not loaded" in err and "96 token ids" in err, err
    assert len(json.loads(out)["token_ids"]) == 30


def test_a_weights_link_to_a_missing_blob_is_named_as_such(models, tmp_path, capsys):
    """A snapshot's link whose blob is gone (the HF cache's layout) was "not a weights file (a
    directory or a device)"."""
    d = tmp_path / "snap"
    shutil.copytree(models["small"], d)
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").symlink_to("../../blobs/0123abcd")
    err = cli_error(capsys, "generate", "--target", str(d), "--prompt-ids", "1,2", "--max-new-tokens", "2")
    assert f"{d}/model.safetensors: a link to ../../blobs/0123abcd, which is missing" in err, err


# ---- tree shapes with empty fields ------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["--strategy", "tree:3--2"], ["--strategy", "tree:-3"], ["--strategy", "tree:3-2-"],
                                  ["--strategy", "tree", "--tree", "3,,2"], ["--strategy", "mab", "--arms", "3,2;,1"]],
                         ids=["double-dash", "leading-dash", "trailing-dash", "double-comma", "arm"])
def test_a_tree_shape_with_an_empty_field_is_refused(argv, tmp_path, capsys):
    """`tree:3--2` (a typo, or 3 then -2) ran as tree 3,2 and `tree:-3` as tree 3: empty fields were
    dropped silently. Refused before loading (--tree and --arms were read only after it)."""
    for cmd in ("generate", "bench"):
        err = cli_error(capsys, cmd, "--target", str(tmp_path / "nowhere"), "--drafter", str(tmp_path / "nowhere"),
                        "--prompt-ids", "1,2", "--max-new-tokens", "2", *argv)
        assert "bad tree shape" in err and "expected comma-separated positive integers" in err and "nowhere" not in err, err


# ---- chat templates that fail while rendering ------------------------------------------------------
@pytest.mark.parametrize("template, expect", [
    ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
     "{{ m.content }}{% endfor %}", "System role not supported"),
    ("{{ messages[5].content }}", "list object has no element 5"),
    ("{{ 1 / 0 }}", "division by zero"),
    ("{{ ''.__class__.__mro__ }}", "unsafe"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion"),
    ("{% for i in range(10**9) %}x{% endfor %}", "MAX_RANGE"),
], ids=["raise_exception", "undefined", "zero-division", "sandbox", "recursion", "range"])
def test_a_chat_template_that_fails_is_one_line(template, expect, models, tmp_path, capsys):
    d = with_template(models["chat"], tmp_path / "m", template)
    err = cli_error(capsys, "generate", "hello", "--system", "be brief", "--target", str(d), "--max-new-tokens", "2")
    assert "m's chat template failed on this conversation" in err and expect in err, err


def test_a_failing_chat_template_in_bench_and_distill_data(models, tmp_path, capsys):
    d = with_template(models["chat"], tmp_path / "m", "{{ raise_exception('no users here') }}")
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"name": "a", "text": "hello there"}]))
    err = cli_error(capsys, "bench", "--target", str(d), "--prompts", str(prompts), "--strategies", "ar", "--max-new-tokens", "2")
    assert "chat template failed" in err and "no users here" in err, err
    err = cli_error(capsys, "distill", "data", "--target", str(d), "--out", str(tmp_path / "data"), "--prompts", str(prompts),
                    "--batch", "1", "--max-new-tokens", "2")
    assert "chat template failed" in err and "no users here" in err, err
    # --raw skips the template: the model still generates
    code, _, err = run(capsys, "generate", "hello", "--raw", "--target", str(d), "--max-new-tokens", "2")
    assert code == 0, err


def test_a_chat_template_file_that_is_not_utf8_is_named(models, tmp_path, capsys):
    d = tmp_path / "m"
    shutil.copytree(models["chat"], d)
    (d / "chat_template.jinja").write_bytes(b"\xff\xfe{{ messages }}")
    err = cli_error(capsys, "generate", "hello", "--target", str(d), "--max-new-tokens", "2")
    assert f"{d}/chat_template.jinja: not UTF-8 text" in err and "tokenizer.json" not in err, err


# ---- a reader that goes away -----------------------------------------------------------------------
class _ClosedPipe(io.StringIO):
    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stdout_stops_generate_quietly(models, capsys, monkeypatch):
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    code = main(["generate", "--target", str(models["long"]), "--prompt-ids", "1,2", "--max-new-tokens", "4", "--dtype", "fp32"])
    err = capsys.readouterr().err
    assert code == 141 and "Traceback" not in err and "error" not in err, err


def test_generate_into_head_has_no_traceback(models):
    """`specchat generate ... | head -c 20`: the reader leaves; no BrokenPipeError traceback, no
    "Exception ignored" at exit."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "generate", "--target", str(models["long"]), "--prompt-ids",
                             "1,2", "--max-new-tokens", "3000", "--strategy", "ar", "--dtype", "fp32"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = proc.stdout.read(20)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert len(head) == 20
    assert proc.returncode == 141 and "Traceback" not in err and "Exception ignored" not in err, err


# ---- Ctrl-C in bench -------------------------------------------------------------------------------
@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_ctrl_c_in_bench_keeps_the_prompts_measured(as_json, models, tmp_path, capsys, monkeypatch):
    """Ctrl-C on the third prompt: the first two prompts' rows (every strategy) and their summary are
    printed, the prompt cut midway is left out, exit 130."""
    from engine import bench

    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"name": f"q{i}", "text": f"prompt number {i}"} for i in range(4)]))
    real, calls = bench.run_generation, []

    def interrupted_on_the_sixth(*a, **kw):
        calls.append(1)
        if len(calls) == 6:  # q0: ar, pld; q1: ar, pld; q2: ar, then here
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(bench, "run_generation", interrupted_on_the_sixth)
    argv = ["bench", "--target", str(models["chat"]), "--prompts", str(prompts), "--strategies", "ar,pld", "--warmup", "0",
            "--max-new-tokens", "4", "--dtype", "fp32"] + (["--json"] if as_json else [])
    code, out, err = run(capsys, *argv)
    assert code == 130, err
    assert "specchat: interrupted: 2 of 4 prompts measured (the one cut midway is left out)" in err, err
    if as_json:
        res = json.loads(out.strip().splitlines()[-1])
        assert res["interrupted"] is True and res["settings"]["prompts"] == 2
        assert {(r["strategy"], r["prompt"]) for r in res["rows"]} == {
            (s, p) for s in ("ar", "pld") for p in ("q0", "q1", "ALL", "MEDIAN")}
    else:
        rows = [ln.split() for ln in out.splitlines() if ln.startswith(("ar ", "pld "))]
        assert {(r[0], r[2]) for r in rows} == {(s, p) for s in ("ar", "pld") for p in ("q0", "q1", "ALL", "MEDIAN")}, out
        assert "2 prompts" in out


def test_ctrl_c_in_bench_before_a_prompt_is_measured_prints_no_table(models, tmp_path, capsys, monkeypatch):
    from engine import bench

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_generation", interrupted)
    code, out, err = run(capsys, "bench", "--target", str(models["chat"]), "--strategies", "ar", "--warmup", "0",
                         "--max-new-tokens", "4", "--dtype", "fp32", "--prompt-ids", "1,2")
    assert code == 130 and out == "" and "specchat: interrupted: 0 of 1 prompts measured" in err, err


def test_bench_checks_every_prompt_against_the_context_before_measuring(models, tmp_path, capsys, monkeypatch):
    """A prompt longer than the context failed the run when its turn came, after minutes of
    measuring the others, and without saying which prompt."""
    from engine import bench

    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"name": "short", "text": "hi"}, {"name": "essay", "text": "word " * 200}]))
    calls = []
    real = bench.run_generation
    monkeypatch.setattr(bench, "run_generation", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    err = cli_error(capsys, "bench", "--target", str(models["chat"]), "--prompts", str(prompts), "--strategies", "ar,pld",
                    "--max-new-tokens", "4", "--max-context", "128", "--dtype", "fp32")
    assert "prompt 'essay' is 1017 tokens but the context holds 128" in err and "--max-context" in err, err
    assert calls == []  # nothing measured: the check comes first


# ---- bench's measuring modes read --models ---------------------------------------------------------
def test_verify_cost_and_tree_scaling_take_a_models_toml_name(models, tmp_path, capsys):
    toml = tmp_path / "models.toml"
    toml.write_text(f'[[model]]\nname = "mine"\nlocal = "{models["small"]}"\ndefault = true\n')
    code, out, err = run(capsys, "bench", "--verify-cost", "--models", str(toml), "--target", "mine", "--json", "--dtype", "fp32")
    assert code == 0 and "llama-0" not in err and json.loads(out)["target"].startswith("mine"), err
    code, out, err = run(capsys, "bench", "--verify-cost", "--models", str(toml), "--json", "--dtype", "fp32")  # its default
    assert code == 0 and json.loads(out)["target"].startswith("mine"), err
    code, out, err = run(capsys, "bench", "--tree-scaling", "--models", str(toml), "--target", "mine", "--json", "--dtype", "fp32")
    assert code == 0 and json.loads(out)["target"].startswith("mine"), err
    err = cli_error(capsys, "bench", "--verify-cost", "--target", str(models["small"]), "--max-context", "4")
    assert "--verify-cost measures passes of up to 32 rows after 128 tokens: --max-context must be at least 161" in err, err


# ---- distill data --prompts, bounded -----------------------------------------------------------------
def test_distill_data_prompts_file_is_read_with_a_bound(tmp_path, capsys):
    err = cli_error(capsys, "distill", "data", "--target", str(tmp_path / "nowhere"), "--out", str(tmp_path / "d"),
                    "--prompts", "/dev/zero")
    assert "/dev/zero: prompts file larger than" in err, err


# ---- the Hub -----------------------------------------------------------------------------------------
@pytest.fixture
def fake(monkeypatch, tmp_path):
    with FakeHub() as fh:
        fh.use(monkeypatch, tmp_path)
        monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "5")
        yield fh


WEIGHTS = bytes(range(256)) * 40  # 10,240 bytes: an LFS file with a sha256


@pytest.mark.parametrize("entry", [
    "model.safetensors",
    ["model.safetensors", 3],
    {"rfilename": "a.json", "size": 3, "lfs": "not-an-object"},
    {"rfilename": "a.json", "size": 3, "blobId": 12},
    {"rfilename": ["a.json"], "size": 3},
    {"rfilename": "a.json", "size": True},
], ids=["string", "list", "lfs-string", "blob-id-int", "name-list", "size-bool"])
def test_a_hub_listing_with_malformed_entries_is_one_line(entry, fake, capsys):
    repo = fake.add_repo("org/odd", {"config.json": b"{}", "model.safetensors": WEIGHTS})
    repo.extra_siblings = [entry]
    err = cli_error(capsys, "download", "org/odd")
    assert "org/odd: the Hub listing has a malformed entry" in err, err


@pytest.mark.parametrize("siblings", ["notalist", {"a": 1}, 7])
def test_a_hub_listing_whose_siblings_are_not_a_list_is_one_line(siblings, fake, capsys, monkeypatch):
    from . import fakehub

    def listing(self, repo_id, rev, blobs):
        self._send(200, json.dumps({"sha": "a" * 40, "siblings": siblings}).encode(), {"Content-Type": "application/json"})

    monkeypatch.setattr(fakehub._Handler, "_listing", listing)
    err = cli_error(capsys, "download", "org/odd")
    assert "org/odd: the Hub's answer is not a model listing" in err, err


@pytest.mark.parametrize("url", ["notaurl", "ftp://example.com", "http://[::1", "http://", "file:///etc", "http://localhost:99999"])
def test_an_hf_endpoint_that_is_not_an_http_url_is_named(url, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    err = cli_error(capsys, "download", "org/tiny")
    assert f"HF_ENDPOINT={url!r} is not a valid http(s) URL" in err, err


@pytest.mark.parametrize("value", ["-1", "nan", "0", "inf", "soon"])
def test_hub_timeouts_that_are_not_positive_numbers_fall_back(value, monkeypatch):
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", value)
    assert hub._timeout("HF_HUB_ETAG_TIMEOUT") == 10.0
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2.5")
    assert hub._timeout("HF_HUB_ETAG_TIMEOUT") == 2.5


def test_a_timeout_that_is_not_a_number_still_reaches_the_hub(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")  # nothing listens there
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "-1")
    assert "cannot reach the Hugging Face Hub" in cli_error(capsys, "download", "org/tiny")


def _partial_of(tmp_path: Path, data: bytes) -> Path:
    import hashlib

    blob = tmp_path / "cache" / "models--org--tiny" / "blobs" / hashlib.sha256(WEIGHTS).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    part = blob.with_name(blob.name + ".incomplete")
    part.write_bytes(data)
    return part


def test_a_complete_partial_file_left_by_a_kill_is_verified_and_kept(fake, tmp_path):
    """A run killed after the last byte but before the rename left <blob>.incomplete whole: the next
    run reported "all in place" and linked the snapshot to a blob that did not exist."""
    fake.add_repo("org/tiny", {"config.json": b"{}", "model.safetensors": WEIGHTS})
    part = _partial_of(tmp_path, WEIGHTS)
    snap = hub.download("org/tiny")
    assert (snap / "model.safetensors").read_bytes() == WEIGHTS
    assert not part.exists()
    assert fake.bytes_sent["org/tiny/model.safetensors"] == 0  # nothing fetched again


def test_a_complete_but_corrupt_partial_file_is_fetched_afresh(fake, tmp_path):
    fake.add_repo("org/tiny", {"config.json": b"{}", "model.safetensors": WEIGHTS})
    _partial_of(tmp_path, b"\0" * len(WEIGHTS))
    with pytest.raises(hub.DownloadError, match="failed its checksum"):
        hub.download("org/tiny")
    snap = hub.download("org/tiny")  # the corrupt one was dropped: this run fetches it whole
    assert (snap / "model.safetensors").read_bytes() == WEIGHTS


def test_a_server_that_sends_more_than_its_listing_keeps_nothing(fake, tmp_path, monkeypatch):
    fake.add_repo("org/tiny", {"config.json": b"{}", "model.safetensors": WEIGHTS})
    real = FakeRepo.sibling

    def short(self, path):
        e = real(self, path)
        if path == "model.safetensors":
            e["size"] -= 1000
        return e

    monkeypatch.setattr(FakeRepo, "sibling", short)
    with pytest.raises(hub.DownloadError) as e:
        hub.download("org/tiny")
    msg = str(e.value)
    assert "sent more than the 9240 bytes its listing gives for model.safetensors" in msg and "run it again" not in msg, msg
    assert not list((tmp_path / "cache").rglob("*.incomplete"))
    monkeypatch.setattr(FakeRepo, "sibling", real)  # the listing is right again: the next run succeeds
    assert (hub.download("org/tiny") / "model.safetensors").read_bytes() == WEIGHTS


# ---- Ctrl-C while `distill ngram` writes its datastore ------------------------------------------------
def test_ctrl_c_while_distill_ngram_writes_leaves_no_half_file(tmp_path, capsys, monkeypatch):
    """Ctrl-C mid-write kept the previous datastore but left the half-written temporary beside it."""
    import numpy as np

    from .test_distill import _ROWS, _replies

    data = _replies(tmp_path / "d", _ROWS)
    out = tmp_path / "ds.npz"
    out.write_bytes(b"the previous datastore")

    def interrupted(path, **kw):
        Path(path).write_bytes(b"PK half")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez_compressed", interrupted)
    code, _, err = run(capsys, "distill", "ngram", "--data", data, "--out", str(out), "--target", str(REPO / "assets/mamba-drafter-smollm2"),
                       "--min-count", "1")
    assert code == 130 and "interrupted" in err, err
    assert out.read_bytes() == b"the previous datastore" and sorted(p.name for p in tmp_path.iterdir()) == ["d", "ds.npz"]


# ---- a malformed Hub token ---------------------------------------------------------------------------
@pytest.mark.parametrize("token", ["hf_secretA\nhf_secretB", "hf_secret with space", "hf_s\u20acret"], ids=["newline", "space", "non-ascii"])
def test_a_malformed_hub_token_is_refused_without_printing_it(token, fake, capsys, monkeypatch, tmp_path):
    """A token with a line break (a token file of two lines) failed in http.client with "Invalid
    header value b'Bearer <the token>'": the secret on the terminal."""
    fake.add_repo("org/tiny", {"config.json": b"{}", "model.safetensors": WEIGHTS})
    monkeypatch.setenv("HF_TOKEN", token)
    err = cli_error(capsys, "download", "org/tiny")
    assert "HF_TOKEN is not a Hub token" in err and "secret" not in err and "s\u20acret" not in err, err
    monkeypatch.delenv("HF_TOKEN")
    (tmp_path / "hf-home").mkdir(exist_ok=True)
    (tmp_path / "hf-home" / "token").write_text(token + "\n")
    err = cli_error(capsys, "download", "org/tiny")
    assert f"{tmp_path / 'hf-home' / 'token'} does not hold a Hub token" in err and "secret" not in err, err


# ---- a target whose embedding has padding rows its drafter lacks ------------------------------------
def test_a_target_padding_id_does_not_break_a_drafter_with_fewer_rows(tmp_path):
    """Qwen2.5-7B (152064 rows) and Qwen2.5-0.5B (151936) share one tokenizer, so they pair without
    a bridge; an id of the 7B's padding rows, once the target emitted it, indexed past the
    drafter's embedding: an IndexError mid-reply. Here the target's padding row 259 (a byte
    tokenizer of 259 ids) wins where the token it copies would, and the drafter has 259 rows."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.generate import Decoder, run_generation
    from engine.loading import load
    from engine.strategy import preset

    def make(name, vocab, seed):
        cfg = AutoConfig.for_model("llama", vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                                   tie_word_embeddings=False)
        torch.manual_seed(seed)
        m = AutoModelForCausalLM.from_config(cfg).eval()
        with torch.no_grad():
            m.lm_head.weight.mul_(40.0)  # sharp logits: no greedy ties
        return m, tmp_path / name

    prompt = [72, 101, 108, 108, 111]
    target, tdir = make("target", 260, 0)
    drafter, ddir = make("drafter", 259, 1)
    with torch.no_grad():  # the padding row copies the target's 4th greedy token's row, a little stronger
        out = target.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)
        k = int(out[0, -1])
        w = target.lm_head.weight
        w[259] = w[k] * 1.5 if float(target(out[:, :-1]).logits[0, -1, k]) > 0 else w[k] * 0.5
    for m, d in ((target, tdir), (drafter, ddir)):
        m.save_pretrained(d)
        ByteTokenizer().save(d)
    tgt, drf = load(str(tdir), dtype="fp32"), load(str(ddir), dtype="fp32")
    assert drf.model.vocab_size == 259 < tgt.model.vocab_size == 260
    ar, _ = run_generation(Decoder(tgt.model), prompt, preset("ar"), 40)
    plain = [t for e in ar for t in e.emitted]
    assert 259 in plain, plain  # the padding id is emitted, and fed to the drafter below
    for spec in ("sd", "tree"):
        dec = Decoder(tgt.model, drafter_model=drf.model, target_tokenizer=tgt.tokenizer, drafter_tokenizer=drf.tokenizer)
        events, _ = run_generation(dec, prompt, preset(spec), 40)
        assert [t for e in events for t in e.emitted] == plain, spec


# ---- stdin: a bound, and a byte-order mark -----------------------------------------------------------
class _Zeros(io.RawIOBase):
    """/dev/zero: as many zero bytes as are asked for, forever (counts what was read)."""

    def __init__(self):
        self.read_bytes = 0

    def readable(self):
        return True

    def readinto(self, b):
        b[:] = bytes(len(b))
        self.read_bytes += len(b)
        return len(b)


def test_generate_reads_stdin_with_a_bound(models, capsys, monkeypatch):
    """`specchat generate < /dev/zero` read until memory ran out."""
    from engine.bench import MAX_PROMPTS_BYTES

    zeros = _Zeros()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BufferedReader(zeros), encoding="utf-8"))
    err = cli_error(capsys, "generate", "--target", str(models["chat"]), "--raw", "--max-new-tokens", "2")
    assert "the prompt on stdin is larger than 64 MB (not a prompt?)" in err, err
    assert zeros.read_bytes <= MAX_PROMPTS_BYTES + (1 << 20)


def test_a_byte_order_mark_is_not_part_of_a_prompt(monkeypatch, tmp_path):
    """A prompt file saved by Notepad starts with U+FEFF: it went into the prompt's tokens (stdin)
    and into the first prompt of `bench --prompts` (a .txt file)."""
    from engine.bench import load_prompts
    from engine.cli import _read_stdin

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbfhello"), encoding="utf-8"))
    assert _read_stdin() == "hello"
    monkeypatch.setattr("sys.stdin", io.StringIO("\ufeffhello"))
    assert _read_stdin() == "hello"
    f = tmp_path / "prompts.txt"
    f.write_bytes(b"\xef\xbb\xbffirst\r\nsecond\r\n")
    assert [p["text"] for p in load_prompts(f)] == ["first", "second"]
    j = tmp_path / "prompts.json"
    j.write_bytes(b'\xef\xbb\xbf[{"text": "one"}]')
    assert [p["text"] for p in load_prompts(j)] == ["one"]
