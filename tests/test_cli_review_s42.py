"""CLI input the review of session 42 found mishandled: each is now one clear line (exit 2) before
any model loads, where it used to run something else silently or name the wrong thing.

- an empty option value (``--target "$T"`` with T unset) ran the default (--target, --drafter,
  --strategy, --prompts, --revision) or read the current directory (--models, --datastore);
- strategy specs ``sd@`` / ``pld:auto@`` (empty vocab bridge) ran as ``sd`` / ``pld:auto``; ``sd:²``
  said "invalid literal for int() with base 10"; ``sd:٣`` ran as sd:3 where ``tree:٣`` is refused;
- models.toml: a hub_id that is no Hub id was accepted (and the load then said "run `specchat
  download m`", which refused it); a model named ``ngram`` / ``none`` could never be a drafter (and
  its pairing silently drafted by prompt lookup); ``size_mb = true`` passed as a number; negative
  ``vocab``; a name with spaces around it that no --target could match;
- a models file without a default target (empty, or none marked ``default = true``) failed with
  "'smollm2-135m-instruct': no such file or directory, and not a models.toml name", a name the
  user never gave.
"""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import hub, loading, session
from engine.cli import main
from engine.errors import ConfigError
from engine.registry import load_registry
from engine.strategy import StrategyError, from_spec
from engine.tokenizer import ByteTokenizer

from .tiny import saved

REPO = Path(__file__).resolve().parents[1]

MODEL = """[[model]]
name = "m"
hub_id = "org/m"
role = ["target", "drafter"]
"""


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a model (or reaching the Hub) fails the test: the errors come before it."""

    def refuse(*a, **kw):
        raise AssertionError("a model was loaded (or the Hub reached) instead of refusing the command line")

    monkeypatch.setattr(session.ChatSession, "load", classmethod(refuse))
    monkeypatch.setattr(loading, "load", refuse)
    monkeypatch.setattr(hub, "download", refuse)


def run(capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err.strip()


def one_error(capsys, *argv: str) -> str:
    code, err = run(capsys, *argv)
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("specchat: error: "), err
    return err


# ---- empty option values ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ("generate", "--target", "", "hi"),
    ("generate", "--drafter", "", "hi"),
    ("generate", "--models", "", "hi"),
    ("generate", "--datastore", "", "hi"),
    ("generate", "--strategy", "", "hi"),
    ("generate", "--strategy", "  ", "hi"),
    ("generate", "--prompt-ids", ""),
    ("bench", "--prompts", "", "--strategies", "ar"),
    ("bench", "--strategies", ""),
    ("bench", "--compare", "", "--strategies", "ar"),
    ("models", "--models", ""),
    ("download", "--revision", "", "org/m"),
])
def test_an_empty_option_value_is_refused_not_taken_as_the_default(argv, capsys, no_loading):
    opt = next(a for a in argv if a.startswith("--"))
    err = one_error(capsys, *argv)
    assert f"{opt} is empty" in err, err


# ---- strategy specs -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, expect", [
    ("", "empty strategy"),
    ("   ", "empty strategy"),
    ("sd@", "nothing after '@'"),
    ("pld:auto@", "nothing after '@'"),
    ("sd:²", "whole number"),       # was: invalid literal for int() with base 10: '²'
    ("sd:٣", "whole number"),       # was: run as sd:3 (tree:٣ is refused)
    ("optimal:¹⁶", "whole number"),
])
def test_malformed_strategy_specs_are_one_clear_line(spec, expect):
    with pytest.raises(StrategyError) as e:
        from_spec(spec)
    assert expect in str(e.value), str(e.value)
    assert "invalid literal" not in str(e.value)


@pytest.mark.parametrize("spec", ["sd@", "sd:²"])
def test_malformed_strategy_specs_fail_before_loading(spec, capsys, no_loading):
    err = one_error(capsys, "generate", "--strategy", spec, "hi")
    assert spec in err


def test_well_formed_specs_still_parse():
    assert from_spec("sd:4@tli").vocab == "tli" and from_spec("sd:4@tli").draft_len == 4
    assert from_spec("pld:auto").adaptive
    s = from_spec("pld:12:auto")
    assert s.adaptive and s.draft_len == 12
    assert from_spec("optimal:24").node_budget == 24
    assert from_spec(" sd ").name == "sd"


# ---- models.toml --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("toml, expect", [
    (MODEL.replace('"org/m"', '"not a hub id!!"'), "hub_id 'not a hub id!!' is not a Hub id"),
    (MODEL + 'alt_hub_id = "x y/z"\n', "alt_hub_id 'x y/z' is not a Hub id"),
    (MODEL.replace('"m"', '"ngram"'), "model name 'ngram' is reserved"),
    (MODEL.replace('"m"', '"none"'), "model name 'none' is reserved"),
    (MODEL + "size_mb = true\n", "key 'size_mb' should be number, got bool"),
    (MODEL + "vocab = -5\n", "vocab must be a positive number"),
    (MODEL + "tok_real = 0\n", "tok_real must be a positive number"),
    (MODEL + "size_mb = -1.5\n", "size_mb must be a positive number"),
    (MODEL.replace('"m"', '" m "'), "has spaces around it"),
])
def test_registry_entries_that_could_never_work_are_refused(toml, expect, tmp_path):
    p = tmp_path / "models.toml"
    p.write_text(toml)
    with pytest.raises(ConfigError) as e:
        load_registry(p)
    assert expect in str(e.value), str(e.value)
    assert str(p) in str(e.value)


def test_a_pairing_with_a_drafter_named_ngram_can_no_longer_be_written(tmp_path, capsys, no_loading):
    p = tmp_path / "models.toml"
    p.write_text(MODEL + "default = true\n" + MODEL.replace('"m"', '"ngram"').replace("org/m", "org/n")
                 + '[[pairing]]\ntarget = "m"\ndrafter = "ngram"\ndefault = true\n')
    err = one_error(capsys, "generate", "--models", str(p), "hi")
    assert "model name 'ngram' is reserved" in err


def test_the_shipped_registry_still_loads():
    reg = load_registry(Path(__file__).resolve().parent.parent / "models.toml")
    assert reg.default_target() is not None and reg.pairings


def test_registry_numbers_and_hub_ids_that_are_fine_still_load(tmp_path):
    p = tmp_path / "models.toml"
    p.write_text(MODEL + 'alt_hub_id = "Org.x/M_1-2.b"\nsize_mb = 0.4\nvocab = 49152\ntok_real = 49152\n')
    e = load_registry(p).get("m")
    assert e.size_mb == 0.4 and e.vocab == 49152 and e.alt_hub_id == "Org.x/M_1-2.b"


# ---- a models file without a default target -----------------------------------------------------------------------
@pytest.mark.parametrize("body, expect", [
    ("", "lists no models"),
    ("model = []\n", "lists no models"),
    (MODEL, "no model has default = true"),
])
@pytest.mark.parametrize("cmd", [("generate", "hi"), ("bench", "--strategies", "ar"), ("bench", "--verify-cost")])
def test_a_models_file_without_a_default_target_says_so(body, expect, cmd, tmp_path, capsys, no_loading):
    p = tmp_path / "models.toml"
    p.write_text(body)
    err = one_error(capsys, cmd[0], "--models", str(p), *cmd[1:])
    assert expect in err and "--target" in err and str(p) in err, err
    assert "smollm2-135m-instruct" not in err


def test_a_models_file_without_a_default_still_serves_an_explicit_target(tmp_path, capsys, monkeypatch):
    p = tmp_path / "models.toml"
    p.write_text(MODEL)
    seen = {}

    def fake_load(cls, target=None, **kw):
        seen["target"] = target
        raise ConfigError("stop here")

    monkeypatch.setattr(session.ChatSession, "load", classmethod(fake_load))
    err = one_error(capsys, "generate", "--models", str(p), "--target", "m", "hi")
    assert seen["target"] == "m" and "stop here" in err


# ---- generate's prompt options ------------------------------------------------------------------------------------
def test_system_with_prompt_ids_is_refused_not_dropped(capsys, no_loading):
    """--prompt-ids are fed as they are: the --system prompt was silently left out."""
    err = one_error(capsys, "generate", "--system", "be terse", "--prompt-ids", "1,2,3")
    assert "--system" in err and "--prompt-ids" in err


@pytest.mark.parametrize("argv, expect", [
    (("generate", "--prompt-ids", "1,2", "hi"), "not both"),
    (("generate", "--prompt-ids", "1;2"), "comma-separated integers"),
])
def test_prompt_id_mistakes_fail_before_loading(argv, expect, capsys, no_loading):
    assert expect in one_error(capsys, *argv)


# ---- an output that cannot be written -----------------------------------------------------------------------------
class _FullDisk(io.StringIO):
    """A stdout on a full disk: the first ``room`` characters are kept, then every write fails."""

    def __init__(self, room: int = 0):
        super().__init__()
        self.room = room

    def write(self, s: str) -> int:
        if self.tell() + len(s) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(s)


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory) -> Path:
    """A tiny checkpoint with a byte-level tokenizer (fast to load)."""
    root = tmp_path_factory.mktemp("review_s42")
    chat = Path(saved("long", str(root)))
    ByteTokenizer().save(chat)
    return chat


@pytest.mark.parametrize("argv", [("--ignore-eos",), ("--ignore-eos", "--json"), ("--samples", "2", "--ignore-eos")])
def test_generate_into_a_full_disk_is_one_line(argv, tiny_chat, capsys, monkeypatch):
    capsys.readouterr()
    out = _FullDisk(room=5)
    monkeypatch.setattr(sys, "stdout", out)
    code = main(["generate", "--target", str(tiny_chat), "--drafter", "none", "--strategy", "ar", "--raw", "--dtype", "fp32",
                 "--max-new-tokens", "40", *argv, "hello"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip() == "specchat: error: cannot write to standard output (No space left on device)", err
    assert sys.stdout is out  # put back as it was


def test_models_into_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    p = tmp_path / "models.toml"
    p.write_text(MODEL)
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdout", _FullDisk())
    code = main(["models", "--models", str(p)])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == "specchat: error: cannot write to standard output (No space left on device)", err


def test_a_closed_stdout_is_one_line_before_any_work(capsys, monkeypatch, no_loading):
    """`specchat generate ... >&-`: sys.stdout is None (was: AttributeError traceback after loading)."""
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdout", None)
    code = main(["generate", "hi"])
    err = capsys.readouterr().err
    assert code == 2 and "standard output is closed" in err and "Traceback" not in err, err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [("models",), ("models", "--json")])
def test_a_full_device_as_stdout_has_no_traceback_and_nothing_ignored_at_exit(argv, tmp_path):
    p = tmp_path / "models.toml"
    p.write_text(MODEL)
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "engine.cli", *argv, "--models", str(p)], cwd=REPO, stdout=full,
                              stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.strip() == "specchat: error: cannot write to standard output (No space left on device)", err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_closed_stdout_in_a_real_process(tmp_path):
    p = tmp_path / "models.toml"
    p.write_text(MODEL)
    proc = subprocess.run(f'"{sys.executable}" -m engine.cli models --models "{p}" >&-', shell=True, cwd=REPO,
                          stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "standard output is closed" in err and "Traceback" not in err, err


# ---- stdin that cannot be read ------------------------------------------------------------------------------------
def test_a_closed_stdin_is_an_empty_prompt_not_a_traceback(tiny_chat, capsys, monkeypatch):
    """`specchat generate <&-`: sys.stdin is None (was: AttributeError 'NoneType' has no attribute 'isatty')."""
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", None)
    code = main(["generate", "--target", str(tiny_chat), "--drafter", "none", "--dtype", "fp32"])
    err = capsys.readouterr().err
    assert code == 2 and "empty prompt" in err and "Traceback" not in err, err


class _BadStdin:
    class buffer:  # noqa: N801 - mimics sys.stdin.buffer
        @staticmethod
        def read(n=-1):
            raise OSError(errno.EIO, "Input/output error")

    encoding = "utf-8"

    def isatty(self) -> bool:
        return False


def test_a_stdin_that_fails_to_read_is_one_line(tiny_chat, capsys, monkeypatch):
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", _BadStdin())
    code = main(["generate", "--target", str(tiny_chat), "--drafter", "none", "--dtype", "fp32"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == "specchat: error: cannot read the prompt on stdin (Input/output error)", err


# ---- bench's prompts and strategies, before anything loads ---------------------------------------------------------
@pytest.mark.parametrize("prompts, strategies, says", [
    ('[{"text": "hi"}, {"text": "  "}]', "ar", "entry 2 has an empty text"),
    ('[{"text": "hi"}, {"name": "x"}]', "ar", "entry 2 is not a {\"text\": ...} object"),
    ('{"text": "hi"}', "ar", "expected a JSON list of {\"text\": ...} objects, got dict"),
    ('[{"text": "hi"}]', ",", "names no strategy"),
    ('[{"text": "hi"}]', "ar,pld@", "nothing after '@'"),
])
def test_bench_refuses_what_it_cannot_measure_before_loading(tmp_path, capsys, no_loading, prompts, strategies, says):
    """A JSON prompt with a blank text was measured (the .txt reader skips blank lines); a wrong
    entry was not named; `--strategies ","` measured the ar baseline alone; `pld@` failed only after
    the model had loaded."""
    f = tmp_path / "p.json"
    f.write_text(prompts)
    assert says in one_error(capsys, "bench", "--prompts", str(f), "--strategies", strategies, "--max-new-tokens", "4")


@pytest.mark.parametrize("knobs, says", [
    (("--strategy", "sd", "--draft-len", "0"), "draft length must be between 1 and 64"),
    (("--strategy", "sd", "--temperature", "1", "--top-p", "0"), "top"),
    (("--strategy", "optimal", "--node-budget", "-5"), "budget"),
])
def test_generate_refuses_a_knob_out_of_range_before_loading(capsys, no_loading, knobs, says):
    """--draft-len 0, --top-p 0, --node-budget -5 with a --strategy were refused only once the models
    had loaded (seconds for SmolLM2, minutes for a big model)."""
    assert says in one_error(capsys, "generate", *knobs, "hi").lower()


# ---- the last small ones ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, says", [
    (("generate", "--prompt-ids", "٣,4"), "--prompt-ids expects comma-separated integers"),
    (("chat", "--max-new-tokens", "0"), "--max-new-tokens must be at least 1 for chat"),
    (("download", "org/m", "--include", ""), "--include is empty"),
])
def test_what_could_only_do_nothing_is_refused(capsys, no_loading, argv, says):
    """`--prompt-ids ٣,4` fed id 3 (int() reads Arabic-Indic digits); `chat --max-new-tokens 0`
    started an app whose every reply ended before its first token; `download --include ''` matched
    no file and said nothing of it."""
    assert says in one_error(capsys, *argv)


def test_hf_hub_offline_downloads_from_the_cache_only(tmp_path, monkeypatch):
    """With HF_HUB_OFFLINE=1 (huggingface_hub's switch), `specchat download` still tried the network
    and then said "cannot reach the Hub ... (offline?)": the cache's snapshot, or a line saying why not."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: a network attempt would fail otherwise
    with pytest.raises(hub.DownloadError, match="not in the cache .* HF_HUB_OFFLINE is set"):
        hub.download("org/x", cache_dir=tmp_path)
    snap = tmp_path / hub.repo_folder("org/x") / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / hub.repo_folder("org/x") / "refs").mkdir()
    (tmp_path / hub.repo_folder("org/x") / "refs" / "main").write_text("a" * 40)
    assert hub.download("org/x", cache_dir=tmp_path) == snap
