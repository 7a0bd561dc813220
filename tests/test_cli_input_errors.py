"""CLI input the audit of session 25 found mishandled (/tmp/s25/cli/report.md, defects 2-4, 6-13 and
15): each is one clear line (exit 2) or a one-line warning, and nothing the user gave is lost.

Unreadable files are simulated where the tests run as root (chmod 000 does not stop root): the
``open`` / ``scandir`` that would fail raises PermissionError for that one path.
"""

from __future__ import annotations

import builtins
import io
import json
import os
from pathlib import Path

import pytest

from engine import loading, registry
from engine.cli import build_parser, main
from engine.errors import ConfigError
from engine.registry import parse_registry
from engine.strategy import Strategy, StrategyError, from_spec

from .test_hardening import cli_error, copy_of
from .tiny import saved


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """(target, drafter): tiny llama checkpoints without a tokenizer; the drafter is the smaller."""
    root = str(tmp_path_factory.mktemp("input_errors"))
    return saved("llama", root), saved("draft", root)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err, cap.err
    return code, cap.out, cap.err


def deny(monkeypatch, module, name: str, path: Path) -> None:
    """``module.name`` (open, os.scandir) raises PermissionError for ``path``, as for a mode-000 file."""
    real = getattr(module, name, None) or getattr(builtins, name)

    def fake(p, *a, **kw):
        if Path(p) == path:
            raise PermissionError(13, "Permission denied", str(p))
        return real(p, *a, **kw)

    monkeypatch.setattr(module, name, fake, raising=False)


def generate_error(capsys, target: Path) -> str:
    return cli_error(capsys, "generate", "--target", str(target), "--prompt-ids", "1,2", "--max-new-tokens", "2")


# ---- #2 unreadable model files and directories -----------------------------------------------------
def test_directory_named_like_the_weights_file(tiny, tmp_path, capsys):
    d = copy_of(tiny[0], tmp_path / "m")
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").mkdir()
    err = generate_error(capsys, d)
    assert f"{d}/model.safetensors: not a weights file" in err, err


def test_unreadable_weights_config_and_directory(tiny, tmp_path, capsys, monkeypatch):
    d = copy_of(tiny[0], tmp_path / "m")
    with monkeypatch.context() as m:
        deny(m, loading, "open", d / "model.safetensors")
        assert f"{d}/model.safetensors: cannot read (Permission denied)" in generate_error(capsys, d)
    with monkeypatch.context() as m:
        deny(m, registry, "open", d / "config.json")
        assert f"{d}/config.json: cannot read config file (Permission denied)" in generate_error(capsys, d)
    with monkeypatch.context() as m:
        deny(m, os, "scandir", d)
        assert f"{d}: cannot read directory (Permission denied)" in generate_error(capsys, d)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads mode-000 files (the test above simulates them)")
def test_mode_000_model_files(tiny, tmp_path, capsys):
    cases = {"model.safetensors": "model.safetensors: cannot read (Permission denied)",
             "config.json": "config.json: cannot read config file (Permission denied)",
             ".": "cannot read directory (Permission denied)"}
    for i, (name, expect) in enumerate(cases.items()):
        d = copy_of(tiny[0], tmp_path / f"m{i}")
        (d / name).chmod(0)
        try:
            assert expect in generate_error(capsys, d)
        finally:
            (d / name).chmod(0o755)


# ---- #3 a prompt that is not UTF-8 -----------------------------------------------------------------
@pytest.fixture
def gguf_with_tokenizer(make_tiny_gguf) -> Path:
    path, _, _ = make_tiny_gguf(chat_template="{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}")
    return path


def test_prompt_bytes_that_are_not_utf8_are_replaced_with_a_warning(gguf_with_tokenizer, capsys, monkeypatch):
    common = ["--target", str(gguf_with_tokenizer), "--max-new-tokens", "2", "--json"]
    # argv: Python keeps such bytes as lone surrogates
    code, out, err = run(capsys, "generate", "\udcff the", "--raw", *common)
    assert code == 0 and "PROMPT is not valid UTF-8: 1 byte(s) replaced by U+FFFD" in err, err
    assert len(json.loads(out)["token_ids"]) == 2
    code, out, err = run(capsys, "generate", "the", "--system", "sys \udcbd", *common)
    assert code == 0 and "--system is not valid UTF-8" in err, err
    # stdin: read as bytes, so a strict locale decoder cannot fail on them either
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe the"), encoding="utf-8"))
    code, out, err = run(capsys, "generate", "--raw", *common)
    assert code == 0 and "the prompt on stdin is not valid UTF-8: 2 byte(s) replaced" in err, err


# ---- #4 bench --prompts that cannot be read --------------------------------------------------------
def test_bench_prompts_directory_or_unreadable(tiny, tmp_path, capsys, monkeypatch):
    argv = ["bench", "--target", str(tiny[0]), "--max-new-tokens", "2", "--strategies", "ar", "--prompts"]
    assert f"{tmp_path}: cannot read prompts file (Is a directory)" in cli_error(capsys, *argv, str(tmp_path))
    f = tmp_path / "p.txt"
    f.write_text("hello\n")
    deny(monkeypatch, registry, "open", f)
    assert f"{f}: cannot read prompts file (Permission denied)" in cli_error(capsys, *argv, str(f))


# ---- #6 bench --tree-scaling --target X/config.json ------------------------------------------------
@pytest.mark.parametrize("change, expect", [
    ({"hidden_size": "64"}, "config field 'hidden_size' has an absurd value '64'"),
    ({"num_attention_heads": 5, "num_key_value_heads": 2}, "num_attention_heads 5 is not a multiple of num_key_value_heads 2"),
    ({"model_type": "bert"}, "unknown architecture model_type='bert' (supported: "),
    (b"{\"model_type\": \"\xbd\"}", "invalid JSON"),
    (None, "cannot read config file (No such file or directory)"),
], ids=["string-size", "heads", "unknown-type", "not-utf8", "missing"])
def test_tree_scaling_config_json_is_checked_as_a_model_directory(change, expect, tiny, tmp_path, capsys):
    cfg_path = tmp_path / "config.json"
    if isinstance(change, bytes):
        cfg_path.write_bytes(change)
    elif change is not None:
        cfg = json.loads((tiny[0] / "config.json").read_text())
        cfg_path.write_text(json.dumps({**cfg, **change}))
    err = cli_error(capsys, "bench", "--tree-scaling", "--target", str(cfg_path))
    assert err.startswith(f"specchat: error: {cfg_path}: ") and expect in err, err
    if change == {"model_type": "bert"}:  # this project's types, not every type transformers knows
        assert "llama" in err and "albert" not in err and len(err) < 300, err


# ---- #7 draft lengths checked when the spec is read ------------------------------------------------
@pytest.mark.parametrize("spec, expect", [("sd:0", "draft length must be between 1 and 64, not 0"),
                                          ("pld:65:auto", "draft length must be between 1 and 64, not 65"),
                                          ("optimal:1000", "node budget must be between 1 and 256")])
def test_spec_ranges_are_checked_before_loading(spec, expect, tmp_path, capsys):
    with pytest.raises(StrategyError, match=expect):
        from_spec(spec)
    # a target that does not exist: the spec's error comes first, so nothing was loaded
    err = cli_error(capsys, "generate", "hi", "--strategy", spec, "--target", str(tmp_path / "nowhere"))
    assert expect in err and "nowhere" not in err, err
    assert expect in cli_error(capsys, "chat", "--strategy", spec, "--target", str(tmp_path / "nowhere"))


def test_registry_pairing_with_an_out_of_range_draft_length(tmp_path):
    data = {"model": [{"name": "t", "local": "t"}, {"name": "d", "local": "d"}],
            "pairing": [{"target": "t", "drafter": "d", "strategy": "sd:0"}]}
    with pytest.raises(ConfigError) as e:
        parse_registry(data, tmp_path / "models.toml")
    assert f"{tmp_path / 'models.toml'}: [[pairing]] #1: bad strategy (strategy 'sd:0': the draft length" in str(e.value)


# ---- #8 temperatures too small to sample with ------------------------------------------------------
def test_tiny_temperature_is_refused_before_loading(tmp_path, capsys):
    err = cli_error(capsys, "generate", "hi", "--temperature", "1e-38", "--target", str(tmp_path / "nowhere"))
    assert "--temperature 1e-38 is too small" in err and "use 0 for greedy" in err, err
    with pytest.raises(StrategyError, match="too small"):
        Strategy(name="ar", drafter="none", temperature=1e-7).validate()
    Strategy(name="ar", drafter="none", temperature=1e-6).validate()
    Strategy(name="ar", drafter="none", temperature=0.0).validate()
    gen = next(a for a in build_parser()._subparsers._group_actions[0].choices["generate"]._actions
               if "--temperature" in a.option_strings)
    assert "1e-6" in gen.help


# ---- #9 a registry datastore that is missing -------------------------------------------------------
def test_missing_registry_datastore_is_a_warning(tiny, tmp_path, capsys):
    toml = tmp_path / "models.toml"
    toml.write_text(f'[[model]]\nname = "t"\nlocal = "{tiny[0]}"\ndatastore = "gone.npz"\n')
    code, out, err = run(capsys, "generate", "--models", str(toml), "--target", "t", "--prompt-ids", "1,2",
                         "--max-new-tokens", "2")
    assert code == 0, err
    assert f"specchat: warning: {tmp_path / 'gone.npz'}: no such n-gram datastore; pld:auto drafts by prompt lookup alone" in err


# ---- #10 generate on a checkpoint without a tokenizer ----------------------------------------------
def test_generate_without_tokenizer_prints_the_ids(tiny, capsys):
    argv = ["generate", "--target", str(tiny[0]), "--prompt-ids", "1,2,3", "--max-new-tokens", "6", "--dtype", "fp32"]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    code, js, _ = run(capsys, *argv, "--json")
    assert out.strip() == ",".join(map(str, json.loads(js)["token_ids"])) and out.count(",") == 5


# ---- #11 bench --prompt-ids ------------------------------------------------------------------------
def test_bench_prompt_ids_are_the_prompt(tiny, tmp_path, capsys):
    argv = ["bench", "--target", str(tiny[0]), "--prompt-ids", "1,2,3", "--strategies", "ar", "--warmup", "0",
            "--max-new-tokens", "3"]
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    res = json.loads(out.strip().splitlines()[-1])
    assert res["settings"]["prompts"] == 1 and {r["prompt"] for r in res["rows"]} == {"ids", "ALL", "MEDIAN"}
    assert res["settings"]["chain_scorer"] is None  # no drafter: nothing ranks mixed chains
    f = tmp_path / "p.txt"
    f.write_text("hello\n")
    assert "give --prompts or --prompt-ids, not both" in cli_error(capsys, *argv, "--prompts", str(f))


# ---- #12 a seed out of range -----------------------------------------------------------------------
def test_seed_out_of_range(tmp_path, capsys):
    nowhere = str(tmp_path / "nowhere")
    err = cli_error(capsys, "generate", "hi", "--target", nowhere, "--seed", str(10**23))
    assert "--seed must be between -9223372036854775808 and 18446744073709551615" in err, err
    err = cli_error(capsys, "generate", "hi", "--target", nowhere, "--seed", str(2**64 - 1), "--samples", "2")
    assert "--seed" in err and "S..S+N-1" in err, err
    assert "--seed" in cli_error(capsys, "bench", "--target", nowhere, "--seed", str(-(2**63) - 1))
    # in range: the error is the missing target's
    assert "nowhere" in cli_error(capsys, "generate", "hi", "--target", nowhere, "--seed", str(2**64 - 1))


# ---- #13 a drafter no smaller than the target ------------------------------------------------------
def test_drafter_not_smaller_than_target_warns(tiny, capsys):
    target, small = tiny
    common = ["--prompt-ids", "1,2", "--strategy", "sd:2", "--max-new-tokens", "2", "--json", "--dtype", "fp32"]
    code, _, err = run(capsys, "generate", "--target", str(small), "--drafter", str(target), *common)
    assert code == 0 and "the drafter llama-0 (" in err and "is not smaller than the target draft-0" in err, err
    code, _, err = run(capsys, "generate", "--target", str(target), "--drafter", str(target), *common)
    assert code == 0 and "not smaller" in err, err
    code, _, err = run(capsys, "generate", "--target", str(target), "--drafter", str(small), *common)
    assert code == 0 and "not smaller" not in err, err


# ---- #15 small config files read with a bound ------------------------------------------------------
def test_config_readers_are_bounded(tiny, tmp_path, capsys):
    err = cli_error(capsys, "models", "--models", "/dev/zero")
    assert "/dev/zero: models file larger than 1 MB" in err, err
    err = cli_error(capsys, "bench", "--target", str(tmp_path / "nowhere"), "--prompts", "/dev/zero")
    assert "/dev/zero: prompts file larger than" in err, err
    d = copy_of(tiny[0], tmp_path / "m")
    (d / "config.json").unlink()
    (d / "config.json").symlink_to("/dev/zero")
    assert f"{d}/config.json: config file larger than" in generate_error(capsys, d)
    d = copy_of(tiny[0], tmp_path / "m2")
    (d / "draft_vocab.json").symlink_to("/dev/zero")
    assert f"{d}/draft_vocab.json: draft vocabulary larger than" in generate_error(capsys, d)
