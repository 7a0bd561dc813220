"""Hardening (issue 8): bad input. Every case is a clear one-line error: through the CLI exit 2 and
one ``specchat: error: ...`` line on stderr (no traceback); through the Python API a
``SpecchatError`` subclass (never a raw ValueError, KeyError, struct.error, JSONDecodeError, ...).

Then fuzzing (hypothesis, bounded): random and mutated GGUF files, models.toml files and tokenizer
directories either load or raise ``SpecchatError``; any other exception is a bug.

Cases already covered elsewhere and not repeated here: a nonexistent --target, a missing or
syntactically broken models.toml, unknown and duplicate keys in it (tests/test_cli.py); GGUF
damage through ``load_gguf`` (tests/test_gguf.py); the families' own config checks
(tests/test_mamba*.py, tests/test_granite_hybrid.py).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.cli import main
from engine.errors import ConfigError, ModelLoadError, SpecchatError
from engine.gguf import load_gguf, read_gguf
from engine.loading import load
from engine.registry import ROLES, load_registry, parse_registry
from engine.tokenizer import ByteTokenizer, Tokenizer

from .conftest import tiny_vocab
from .tiny import saved

# Fuzz budget: 150 cheap examples per target, derandomized so every run sees the same inputs.
# SPECCHAT_FUZZ_EXAMPLES=N runs N fresh random examples per target instead (a longer bug hunt).
_FUZZ_N = int(os.environ.get("SPECCHAT_FUZZ_EXAMPLES") or 0)
FUZZ = settings(max_examples=_FUZZ_N or 150, deadline=None, derandomize=not _FUZZ_N, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny random llama checkpoint (vocab 96, hidden 64, 4/2 heads, 2 layers, safetensors)."""
    return saved("llama", str(tmp_path_factory.mktemp("hardening")))


def copy_of(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


def cli_error(capsys, *argv: str) -> str:
    """Run the CLI; it must exit 2 with exactly one ``specchat: error:`` line. Returns that line."""
    capsys.readouterr()
    code = main(list(argv))
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert code == 2, (code, cap.err, cap.out[-500:])
    assert len(err.splitlines()) == 1, err
    assert err.startswith("specchat: error: ") and "Traceback" not in err, err
    return err


def api_error(fn: Callable[..., Any], *args: Any, kind: type[SpecchatError] = SpecchatError, **kw: Any) -> str:
    """``fn(*args)`` must raise ``kind`` (a SpecchatError) with a one-line message. Returns it."""
    with pytest.raises(kind) as e:
        fn(*args, **kw)
    msg = str(e.value)
    assert msg and "\n" not in msg, msg
    return msg


def edit_config(d: Path, **changes: Any) -> Path:
    """Update config.json in d; a value of ``DELETE`` removes the key."""
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is DELETE:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Delete()


def check_model_dir_error(capsys, d: Path, *expect: str) -> None:
    """``load(d)`` raises ModelLoadError naming d; ``generate --target d`` exits 2 with one line; both
    messages contain every string in ``expect``."""
    msg = api_error(load, str(d), kind=ModelLoadError)
    assert str(d) in msg, msg
    err = cli_error(capsys, "generate", "--target", str(d), "--prompt-ids", "1,2,3", "--max-new-tokens", "2")
    for e in expect:
        assert e in msg, (e, msg)
        assert e in err, (e, err)


# ---------------------------------------------------------------------------------------------
# (1) paths and config.json
# ---------------------------------------------------------------------------------------------
def test_missing_path_and_directory_without_config(tmp_path, capsys):
    msg = api_error(load, str(tmp_path / "nowhere"), kind=ModelLoadError)
    assert "no such file or directory" in msg
    empty = tmp_path / "empty"
    empty.mkdir()
    check_model_dir_error(capsys, empty, "no config.json")
    stray = tmp_path / "weights.bin"
    stray.write_bytes(b"\0" * 64)
    assert "not a model" in api_error(load, str(stray), kind=ModelLoadError)
    assert "not a model" in cli_error(capsys, "generate", "--target", str(stray), "--prompt-ids", "1")


@pytest.mark.parametrize("text, expect", [
    ("{not json", "invalid JSON"),
    ("[1, 2, 3]", "expected a JSON object"),
    (b"\xff\xfe{}", "invalid JSON"),
], ids=["garbage", "array", "not-utf8"])
def test_unreadable_config_json(text, expect, tiny, tmp_path, capsys):
    d = copy_of(tiny, tmp_path / "m")
    p = d / "config.json"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    check_model_dir_error(capsys, d, "config.json", expect)


BAD_CONFIGS = [
    # unknown architecture
    ({"model_type": "bert"}, "unknown architecture model_type='bert'"),
    ({"model_type": DELETE}, "unknown architecture model_type=None"),
    ({"model_type": ["llama"]}, "model_type must be a string"),
    # missing required fields
    ({"hidden_size": DELETE}, "lacks required field 'hidden_size'"),
    ({"vocab_size": DELETE}, "lacks required field 'vocab_size'"),
    ({"num_hidden_layers": DELETE}, "lacks required field 'num_hidden_layers'"),
    # absurd values
    ({"hidden_size": 0}, "'hidden_size' has an absurd value 0"),
    ({"hidden_size": -64}, "'hidden_size' has an absurd value -64"),
    ({"hidden_size": "64"}, "'hidden_size' has an absurd value '64'"),
    ({"vocab_size": 0}, "'vocab_size' has an absurd value 0"),
    ({"vocab_size": 96.5}, "'vocab_size' has an absurd value 96.5"),
    ({"num_hidden_layers": 10**9}, "'num_hidden_layers' has an absurd value"),
    ({"intermediate_size": True}, "'intermediate_size' has an absurd value True"),
    ({"num_attention_heads": 0}, "'num_attention_heads' has an absurd value 0"),
    ({"num_key_value_heads": "two"}, "'num_key_value_heads' has an absurd value 'two'"),
    ({"head_dim": -16}, "'head_dim' has an absurd value -16"),
    ({"max_position_embeddings": -1}, "'max_position_embeddings' has an absurd value -1"),
    ({"rms_norm_eps": "tiny"}, "'rms_norm_eps' has an absurd value 'tiny'"),
    ({"rms_norm_eps": -1e-6}, "'rms_norm_eps' has an absurd value"),
    ({"rope_scaling": "linear"}, "'rope_scaling' must be an object"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 0}}, "rope_parameters.factor has an absurd value 0"),
    ({"partial_rotary_factor": 0}, "'partial_rotary_factor' has an absurd value 0"),
    # inconsistent values
    ({"num_attention_heads": 6, "head_dim": DELETE}, "hidden_size 64 is not a multiple of num_attention_heads 6"),
    ({"num_attention_heads": 4, "num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"rope_parameters": {"rope_type": "sideways", "rope_theta": 10000.0}}, "rope_type 'sideways' is not supported"),
    # a field the family reads but does not check: caught where the model is built, still one line
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 10000.0}}, "config and weights do not make a model"),
    ({"num_attention_heads": 8}, "self_attn.q_proj.weight has shape"),  # heads * head_dim no longer fits the weights
]


@pytest.mark.parametrize("changes, expect", BAD_CONFIGS, ids=[f"{'+'.join(c)}={list(c.values())[0]!r}"[:48] for c, _ in BAD_CONFIGS])
def test_bad_config_fields(changes, expect, tiny, tmp_path, capsys):
    d = edit_config(copy_of(tiny, tmp_path / "m"), **changes)
    check_model_dir_error(capsys, d, expect)


def test_remote_code_configs_are_refused(tiny, tmp_path, capsys):
    d = edit_config(copy_of(tiny, tmp_path / "m"), model_type="my_custom_lm",
                    auto_map={"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    (d / "modeling_x.py").write_text("raise SystemExit('remote code ran')\n")
    check_model_dir_error(capsys, d, "auto_map", "never runs remote code")
    # an auto_map beside a model_type we implement ourselves is harmless: our code loads it
    d2 = edit_config(copy_of(tiny, tmp_path / "m2"), auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    assert load(str(d2)).model.vocab_size == 96


# ---------------------------------------------------------------------------------------------
# (2) safetensors damage
# ---------------------------------------------------------------------------------------------
def _st_bytes(tiny: Path) -> tuple[bytes, int]:
    data = (tiny / "model.safetensors").read_bytes()
    return data, struct.unpack("<Q", data[:8])[0]


SAFETENSORS_DAMAGE = {
    "empty": lambda data, h: b"",
    "length-cut": lambda data, h: data[:5],
    "header-cut": lambda data, h: data[:8 + h // 2],
    "header-garbage": lambda data, h: data[:8] + b"\x00garbage" * (h // 8) + data[8 + 8 * (h // 8):],
    "header-length-huge": lambda data, h: struct.pack("<Q", 1 << 60) + data[8:],
    "header-not-a-map": lambda data, h: struct.pack("<Q", 2) + b"[]",
    "data-cut": lambda data, h: data[:-1000],
    "data-cut-at-start": lambda data, h: data[:8 + h + 3],
}


@pytest.mark.parametrize("damage", list(SAFETENSORS_DAMAGE))
def test_corrupt_safetensors(damage, tiny, tmp_path, capsys):
    d = copy_of(tiny, tmp_path / "m")
    data, h = _st_bytes(tiny)
    (d / "model.safetensors").write_bytes(SAFETENSORS_DAMAGE[damage](data, h))
    check_model_dir_error(capsys, d, "model.safetensors", "corrupt or truncated safetensors")


@pytest.mark.parametrize("name", ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                                  "model.layers.1.mlp.down_proj.weight", "model.layers.1.post_attention_layernorm.weight",
                                  "model.embed_tokens.weight", "lm_head.weight"])
def test_tensor_with_the_wrong_shape(name, tiny, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    d = copy_of(tiny, tmp_path / "m")
    sd = load_file(str(tiny / "model.safetensors"))
    t = sd[name]
    sd[name] = torch.zeros(t.shape[0] + 2, *t.shape[1:])
    save_file(sd, str(d / "model.safetensors"))
    check_model_dir_error(capsys, d, f"tensor {name} has shape")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_weight_with_nan_or_inf_is_refused(value, tiny, tmp_path, capsys):
    """A damaged weight loaded and decoded garbage; it is named at load now."""
    from safetensors.torch import load_file, save_file

    d = copy_of(tiny, tmp_path / "m")
    sd = load_file(str(tiny / "model.safetensors"))
    sd["model.layers.1.mlp.down_proj.weight"][3, 5] = value
    save_file(sd, str(d / "model.safetensors"))
    check_model_dir_error(capsys, d, "tensor model.layers.1.mlp.down_proj.weight holds NaN or infinite values")


def test_a_config_with_fewer_layers_than_the_weights_is_refused(tiny, tmp_path, capsys):
    """num_hidden_layers below the weights' layers ran a truncated model that decoded garbage."""
    d = copy_of(tiny, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 1
    (d / "config.json").write_text(json.dumps(cfg))
    check_model_dir_error(capsys, d, "the weights hold 2 layers but the config says 1 (num_hidden_layers)")


def test_missing_tensor_and_missing_weights(tiny, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    d = copy_of(tiny, tmp_path / "m")
    sd = load_file(str(tiny / "model.safetensors"))
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, str(d / "model.safetensors"))
    check_model_dir_error(capsys, d, "lacks tensor 'model.layers.1.mlp.up_proj.weight'")
    (d / "model.safetensors").unlink()
    check_model_dir_error(capsys, d, "no weights")


# ---------------------------------------------------------------------------------------------
# (6) pickle checkpoints: tensors only, never code
# ---------------------------------------------------------------------------------------------
class _RunsCode:
    """Unpickling this would create ``marker`` (it must never be unpickled)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _as_bin(tiny: Path, d: Path, obj: Any) -> Path:
    (d / "model.safetensors").unlink()
    torch.save(obj, str(d / "pytorch_model.bin"))
    return d


def test_pickle_with_code_is_refused_and_never_run(tiny, tmp_path, capsys):
    marker = tmp_path / "pwned"
    d = _as_bin(tiny, copy_of(tiny, tmp_path / "m"), {"model.norm.weight": _RunsCode(str(marker))})
    check_model_dir_error(capsys, d, "pytorch_model.bin", "refused", "weights_only=True", "never run")
    assert not marker.exists()


@pytest.mark.parametrize("obj, expect", [
    (lambda sd: {**sd, "extra": collections.Counter(a=1)}, "entry 'extra' is a Counter"),
    (lambda sd: {**sd, "step": 1000}, "entry 'step' is a int"),
    (lambda sd: list(sd.values()), "holds a list, not a state dict"),
    (lambda sd: "weights", "holds a str, not a state dict"),
], ids=["counter", "int", "list", "str"])
def test_pickle_with_non_tensor_objects_is_refused(obj, expect, tiny, tmp_path, capsys):
    from safetensors.torch import load_file

    sd = load_file(str(tiny / "model.safetensors"))
    d = _as_bin(tiny, copy_of(tiny, tmp_path / "m"), obj(sd))
    check_model_dir_error(capsys, d, "pytorch_model.bin", expect)


def test_pickle_garbage_and_a_good_pickle(tiny, tmp_path, capsys):
    from safetensors.torch import load_file

    d = copy_of(tiny, tmp_path / "m")
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"this is not a pickle")
    check_model_dir_error(capsys, d, "pytorch_model.bin", "not readable with torch.load(weights_only=True)")
    good = _as_bin(tiny, copy_of(tiny, tmp_path / "g"), load_file(str(tiny / "model.safetensors")))
    assert load(str(good)).model.vocab_size == 96  # the control: a plain state dict of tensors loads


# ---------------------------------------------------------------------------------------------
# (3) GGUF damage through load() and the CLI (load_gguf itself: tests/test_gguf.py)
# ---------------------------------------------------------------------------------------------
def test_corrupt_gguf_through_the_cli(make_tiny_gguf, tmp_path, capsys):
    path, _, _ = make_tiny_gguf("llama")
    data = path.read_bytes()
    with read_gguf(path) as f:
        data_start = min(t.offset for t in f.tensors.values())
    cases = {
        "magic.gguf": (b"GGML" + data[4:], "not a GGUF file"),
        "empty.gguf": (b"", "empty"),
        "head.gguf": (data[:data_start // 2], "truncated"),
        "counts.gguf": (data[:8] + (1 << 60).to_bytes(8, "little") + data[16:], "truncated or corrupt"),
        "data.gguf": (data[:len(data) - 100], "tensor data is truncated"),
    }
    for name, (blob, expect) in cases.items():
        p = tmp_path / name
        p.write_bytes(blob)
        msg = api_error(load, str(p), kind=ModelLoadError)
        err = cli_error(capsys, "generate", "--target", str(p), "--prompt-ids", "1,2", "--max-new-tokens", "1")
        assert expect in msg and expect in err and str(p) in err, (name, msg, err)
    # a directory holding a single damaged .gguf (no config.json) is loaded as that file
    d = tmp_path / "gguf-dir"
    d.mkdir()
    (d / "model.gguf").write_bytes(data[:len(data) - 100])
    assert "tensor data is truncated" in cli_error(capsys, "generate", "--target", str(d), "--prompt-ids", "1")


def test_gguf_with_absurd_metadata(make_tiny_gguf, tmp_path, capsys):
    path, _, _ = make_tiny_gguf("llama", name="absurd.gguf", extra_kv={"llama.expert_count": 8})
    assert "mixture-of-experts" in api_error(load, str(path), kind=ModelLoadError)
    path, _, _ = make_tiny_gguf("llama", name="ctx.gguf", extra_kv={"llama.context_length": 0})
    assert "not a plausible size" in cli_error(capsys, "generate", "--target", str(path), "--prompt-ids", "1")
    src, _, _ = make_tiny_gguf("llama", name="src.gguf")
    for key, value, expect in [
        # a huge block count used to build a plan of 13 tensors per block first (gigabytes, minutes)
        ("llama.block_count", (1 << 24) - 1, "block_count is 16777215 but the file has the tensors of only 2 blocks"),
        # a rotary dimension wider than the heads used to allocate a rope table of that width
        ("llama.rope.dimension_count", 1 << 20, "rope.dimension_count = 1048576 does not fit heads of 4"),
    ]:
        p = tmp_path / f"{key}.gguf"
        p.write_bytes(_with_extra_metadata(src.read_bytes(), _kv(key, 4, struct.pack("<I", value)), 1))
        assert expect in api_error(load_gguf, p, kind=ModelLoadError)
        assert expect in cli_error(capsys, "generate", "--target", str(p), "--prompt-ids", "1")


# ---------------------------------------------------------------------------------------------
# (4) tokenizer missing or mismatched
# ---------------------------------------------------------------------------------------------
def test_missing_tokenizer(tiny, tmp_path, capsys):
    assert not (tiny / "tokenizer.json").exists()
    msg = api_error(load, str(tiny), need_tokenizer=True, kind=ModelLoadError)
    assert "no tokenizer" in msg and "--prompt-ids" in msg
    err = cli_error(capsys, "generate", "--target", str(tiny), "--raw", "hello there")
    assert "has no tokenizer: pass --prompt-ids" in err
    assert "no tokenizer.json" in api_error(Tokenizer.from_hf_dir, tmp_path, kind=ModelLoadError)


def test_tokenizer_larger_than_the_embedding(tiny, tmp_path, capsys):
    d = copy_of(tiny, tmp_path / "m")
    ByteTokenizer().save(d)  # 259 ids; the model has 96 embedding rows
    check_model_dir_error(capsys, d, "tokenizer has 259 tokens", "only 96 rows", "mismatched tokenizer")


@pytest.mark.parametrize("file, text, expect", [
    ("tokenizer.json", "{\"version\": ", "cannot parse tokenizer"),
    ("tokenizer.json", "{\"model\": {\"type\": \"Nope\"}}", "cannot parse tokenizer"),
    ("tokenizer_config.json", "{bad", "tokenizer_config.json: invalid JSON"),
    ("generation_config.json", "[1, 2", "generation_config.json: invalid JSON"),
], ids=["truncated", "unknown-model", "config", "generation-config"])
def test_corrupt_tokenizer_files(file, text, expect, tiny, tmp_path, capsys):
    d = copy_of(tiny, tmp_path / "m")
    ByteTokenizer().save(d)
    edit_config(d, vocab_size=259)  # the tokenizer would fit: only the damaged file is wrong ...
    from safetensors.torch import load_file, save_file

    sd = load_file(str(d / "model.safetensors"))
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        sd[k] = torch.zeros(259, sd[k].shape[1])
    save_file(sd, str(d / "model.safetensors"))
    assert load(str(d)).tokenizer.vocab_size == 259  # ... as this undamaged control shows
    (d / file).write_text(text)
    check_model_dir_error(capsys, d, expect)
    assert expect.split(":")[-1].strip() in api_error(Tokenizer.from_hf_dir, d, kind=ModelLoadError)


def test_odd_but_valid_json_in_tokenizer_side_files(tmp_path):
    """Side files with unexpected types are ignored, not crashed on."""
    ByteTokenizer().save(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2.5}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": {"a": 1}, "bos_token_id": "x"}))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"eos_token": 7, "bos_token": [1]}))
    tok = Tokenizer.from_hf_dir(tmp_path)
    assert tok.encode("hi") == [104, 105]


# ---------------------------------------------------------------------------------------------
# (5) models.toml
# ---------------------------------------------------------------------------------------------
BAD_TOML = [
    ('[[model]]\nname = "x"\nhub_id = "a/b"\nrole = "target"\n', "key 'role' should be list, got str"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\nvocab = "big"\n', "key 'vocab' should be int, got str"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\nvocab = true\n', "key 'vocab' should be int, got bool"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\ndefault = "yes"\n', "key 'default' should be bool, got str"),
    ('[[model]]\nname = 7\nhub_id = "a/b"\n', "key 'name' should be str, got int"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\nrole = ["target", "oracle"]\n', "unknown role(s) ['oracle']"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\nrole = [{ a = 1 }]\n', "unknown role(s)"),
    ('[[model]]\nname = "x"\n', "needs hub_id or local"),
    ('[[model]]\nhub_id = "a/b"\n', "missing required key 'name'"),
    ('[[model]]\nname = "  "\nhub_id = "a/b"\n', "empty name"),
    ('model = 3\n', "'model' must be an array of tables"),
    ('model = [1, 2]\n', "[[model]] #1: expected a table"),
    ('[settings]\nx = 1\n', "unknown top-level key(s) settings"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\n[[pairing]]\ntarget = "x"\ndrafter = "ghost"\n', "names unknown drafter 'ghost'"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\n[[pairing]]\ntarget = "ghost"\ndrafter = "x"\n', "names unknown target 'ghost'"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\n[[pairing]]\ntarget = "x"\n', "missing required key 'drafter'"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\n[[pairing]]\ntarget = "x"\ndrafter = "x"\nspeed = 3\n', "unknown key 'speed'"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\n[[pairing]]\ntarget = "x"\ndrafter = "x"\nstrategy = "sd:lots"\n',
     "[[pairing]] #1: bad strategy (strategy 'sd:lots'"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\n[[pairing]]\ntarget = "x"\ndrafter = "x"\nstrategy_by_compute = { bf16 = "sd:lots" }\n',
     "[[pairing]] #1: bad strategy_by_compute.bf16 (strategy 'sd:lots'"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\n[[pairing]]\ntarget = "x"\ndrafter = "x"\nstrategy_by_compute = { fp16 = "sd" }\n',
     "strategy_by_compute takes q8, fp32, bf16"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\n[[pairing]]\ntarget = "x"\ndrafter = "x"\nstrategy_by_compute = "sd"\n',
     "key 'strategy_by_compute' should be dict, got str"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\nrevision = 1979-05-27\n', "key 'revision' should be str, got date"),
    ('[[model]]\nname = "x"\nhub_id = "a/b"\n\nname = "y"\n', "TOML syntax error"),
    (b'[[model]]\nname = "\xff"\n', "not UTF-8"),
]


@pytest.mark.parametrize("text, expect", BAD_TOML, ids=[f"toml{i}" for i in range(len(BAD_TOML))])
def test_bad_models_toml(text, expect, tmp_path, capsys):
    p = tmp_path / "models.toml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    msg = api_error(load_registry, p, kind=ConfigError)
    assert str(p) in msg and expect in msg, msg
    err = cli_error(capsys, "models", "--models", str(p))
    assert expect in err and str(p) in err
    # generate reads the registry before anything else: same error, same exit
    assert expect in cli_error(capsys, "generate", "--models", str(p), "--target", "x", "--prompt-ids", "1")


def test_models_toml_with_a_utf8_bom_is_read(tmp_path):
    """Notepad saves UTF-8 with a byte-order mark (and CRLF): that was a TOML syntax error."""
    p = tmp_path / "models.toml"
    p.write_bytes(b'\xef\xbb\xbf[[model]]\r\nname = "x"\r\nhub_id = "a/b"\r\n')
    assert list(load_registry(p).models) == ["x"]


def test_models_toml_that_is_a_directory(tmp_path, capsys):
    assert "cannot read models file" in api_error(load_registry, tmp_path, kind=ConfigError)
    assert "cannot read models file" in cli_error(capsys, "models", "--models", str(tmp_path))


def test_registry_entry_pointing_nowhere(tmp_path, capsys):
    p = tmp_path / "models.toml"
    p.write_text('[[model]]\nname = "ghost"\nlocal = "no/such/dir"\n[[model]]\nname = "remote"\nhub_id = "someone/never-downloaded-x"\n')
    assert "local file 'no/such/dir' is missing" in cli_error(capsys, "generate", "--models", str(p), "--target", "ghost",
                                                              "--prompt-ids", "1")
    assert "specchat download remote" in cli_error(capsys, "generate", "--models", str(p), "--target", "remote", "--prompt-ids", "1")


# ---------------------------------------------------------------------------------------------
# (7) generation input: context overflow and bad prompt ids
# ---------------------------------------------------------------------------------------------
def test_context_overflow(tiny, capsys):
    ids = ",".join(str(i % 90 + 1) for i in range(40))
    err = cli_error(capsys, "generate", "--target", str(tiny), "--max-context", "16", "--prompt-ids", ids)
    assert "prompt is 40 tokens but the context holds 16" in err
    from engine.session import ChatSession

    s = ChatSession.load(target=str(tiny), drafter="none", max_context=16)
    assert "context holds 16" in api_error(s.decoder.start, [1] * 40)
    assert "max_context (--max-context) must be a number of tokens >= 0" in api_error(load, str(tiny), max_context=-5)


@pytest.mark.parametrize("argv, expect", [
    (["--prompt-ids", "1,2,x"], "--prompt-ids expects comma-separated integers"),
    (["--prompt-ids", "1,500"], "token id 500 is outside the model's vocabulary"),
    (["--prompt-ids", "1,-3"], "token id -3 is outside the model's vocabulary"),
    (["--max-context", "-5", "--prompt-ids", "1"], "--max-context must be >= 0, got -5"),
    (["--max-new-tokens", "-1", "--prompt-ids", "1"], "--max-new-tokens must be >= 0, got -1"),
    (["--samples", "0", "--prompt-ids", "1"], "--samples must be >= 1"),
    (["--prompt-ids", "1,2", "also text"], "give PROMPT or --prompt-ids, not both"),
    (["--temperature", "nan", "--prompt-ids", "1"], "--temperature must be a finite number, got nan"),
    (["--temperature", "inf", "--prompt-ids", "1"], "--temperature must be a finite number, got inf"),
    (["--lambda-ucb", "nan", "--prompt-ids", "1"], "--lambda-ucb must be a finite number"),
    (["--dtype", "fp32", "--temperature", "-1", "--prompt-ids", "1"], "temperature"),
    (["--top-p", "0", "--prompt-ids", "1"], "top-p must be in (0, 1]"),
], ids=["not-int", "too-big", "negative", "max-context", "max-new-tokens", "samples", "ids-and-text", "nan-temperature",
    "inf-temperature", "nan-lambda", "temperature", "top-p"])
def test_bad_generate_arguments(argv, expect, tiny, capsys):
    err = cli_error(capsys, "generate", "--target", str(tiny), *argv)
    assert expect in err, err


def test_bench_refuses_a_negative_warmup(tiny, capsys):
    err = cli_error(capsys, "bench", "--target", str(tiny), "--warmup", "-1", "--prompt-ids", "1")
    assert "--warmup must be >= 0, got -1" in err, err


# ---------------------------------------------------------------------------------------------
# Fuzzing: load or SpecchatError, nothing else
# ---------------------------------------------------------------------------------------------
def _load_or_specchat_error(fn: Callable[[], Any]) -> str:
    """The fuzz property: ``fn()`` returns, or raises a one-line SpecchatError (anything else fails
    the test). The outcome is recorded for ``--hypothesis-show-statistics``."""
    try:
        fn()
        outcome = "loads"
    except SpecchatError as e:
        assert str(e) and "\n" not in str(e), repr(str(e))
        outcome = "SpecchatError"
    event(outcome)
    return outcome


@pytest.fixture
def gguf_bytes(make_tiny_gguf) -> tuple[bytes, int]:
    path, _, _ = make_tiny_gguf("llama", name="fuzz-src.gguf", chat_template="{{ messages[0].content }}")
    with read_gguf(path) as f:
        data_start = min(t.offset for t in f.tensors.values())
    return path.read_bytes(), data_start


@FUZZ
@given(data=st.data())
def test_fuzz_gguf_mutations(gguf_bytes, tmp_path, data):
    """Byte edits in the header (counts, lengths, types, metadata values), then maybe a cut."""
    src, data_start = gguf_bytes
    buf = bytearray(src)
    edits = data.draw(st.lists(st.tuples(st.integers(4, data_start - 1), st.integers(0, 255)), min_size=1, max_size=6))
    for pos, val in edits:
        buf[pos] = val
    if data.draw(st.booleans()):
        buf = buf[:data.draw(st.integers(0, len(buf)))]
    p = tmp_path / "fuzz.gguf"
    p.write_bytes(bytes(buf))
    _load_or_specchat_error(lambda: load_gguf(p))


@FUZZ
@given(body=st.binary(max_size=600), version=st.sampled_from([2, 3]),
       counts=st.tuples(st.integers(0, 40), st.integers(0, 40)))
def test_fuzz_gguf_random_bytes(tmp_path, body, version, counts):
    """A valid magic, version and small counts, then random bytes: the parser goes deep."""
    p = tmp_path / "rand.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", version, *counts) + body)
    _load_or_specchat_error(lambda: load_gguf(p))


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", vtype) + payload


_GGUF_VALUES = st.one_of(
    st.integers(0, 2**32 - 1).map(lambda v: (4, struct.pack("<I", v))),
    st.integers(-2**31, 2**31 - 1).map(lambda v: (5, struct.pack("<i", v))),
    st.floats(allow_nan=True, width=32).map(lambda v: (6, struct.pack("<f", v))),
    st.booleans().map(lambda v: (7, struct.pack("<?", v))),
    st.text(max_size=20).map(lambda s: (8, struct.pack("<Q", len(s.encode())) + s.encode())),
    st.lists(st.integers(0, 2**32 - 1), max_size=5).map(lambda xs: (9, struct.pack("<IQ", 4, len(xs)) + b"".join(struct.pack("<I", x) for x in xs))),
    st.lists(st.text(max_size=8), max_size=5).map(
        lambda xs: (9, struct.pack("<IQ", 8, len(xs)) + b"".join(struct.pack("<Q", len(x.encode())) + x.encode() for x in xs))),
)


@FUZZ
@given(overrides=st.dictionaries(st.sampled_from([
    "llama.embedding_length", "llama.block_count", "llama.attention.head_count", "llama.attention.head_count_kv",
    "llama.feed_forward_length", "llama.context_length", "llama.rope.dimension_count", "llama.attention.key_length",
    "llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon", "llama.rope.scaling.type", "llama.rope.scaling.factor",
    "llama.vocab_size", "general.alignment", "general.architecture", "general.file_type", "tokenizer.ggml.model",
    "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.chat_template", "llama.expert_count",
]), _GGUF_VALUES, min_size=1, max_size=3))
def test_fuzz_gguf_metadata_values(gguf_bytes, tmp_path, overrides):
    """Well-formed files whose metadata values have the wrong type or an absurd value: the
    overrides are appended after the original key/values (a repeated key's last value wins)."""
    src, _ = gguf_bytes
    extra = b"".join(_kv(k, *v) for k, v in overrides.items())
    p = tmp_path / "meta.gguf"
    p.write_bytes(_with_extra_metadata(src, extra, len(overrides)))
    _load_or_specchat_error(lambda: load(str(p)))  # through the model build, not just the parse


def _with_extra_metadata(src: bytes, extra: bytes, n_extra: int) -> bytes:
    """The GGUF ``src`` with ``n_extra`` serialised key/values appended to its metadata; the tensor
    data moves to the next 32-byte boundary (tensor offsets are relative to it)."""
    n_tensors, n_kv = struct.unpack_from("<QQ", src, 8)
    kv_end = _kv_block_end(src, n_kv)
    dir_end = _tensor_dir_end(src, kv_end, n_tensors)
    head = src[:8] + struct.pack("<QQ", n_tensors, n_kv + n_extra) + src[24:kv_end] + extra + src[kv_end:dir_end]
    return head + b"\0" * ((-len(head)) % 32) + src[(dir_end + 31) // 32 * 32:]


def _skip_value(buf: bytes, pos: int, vtype: int) -> int:
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if vtype in sizes:
        return pos + sizes[vtype]
    if vtype == 8:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    etype, n = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    for _ in range(n):
        pos = _skip_value(buf, pos, etype)
    return pos


def _kv_block_end(buf: bytes, n_kv: int) -> int:
    pos = 24
    for _ in range(n_kv):
        (n,) = struct.unpack_from("<Q", buf, pos)
        pos += 8 + n
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos = _skip_value(buf, pos + 4, vtype)
    return pos


def _tensor_dir_end(buf: bytes, pos: int, n_tensors: int) -> int:
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<Q", buf, pos)
        pos += 8 + n
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        pos += 4 + 8 * n_dims + 4 + 8
    return pos


def test_gguf_metadata_rewriter(gguf_bytes, tmp_path):
    """The fuzz target above re-serialises the file: with no extra key it loads unchanged, and an
    appended key's value is the one read."""
    src, _ = gguf_bytes
    p = tmp_path / "same.gguf"
    p.write_bytes(_with_extra_metadata(src, b"", 0))
    assert load_gguf(p).config["hidden_size"] == 16
    p.write_bytes(_with_extra_metadata(src, _kv("llama.context_length", 4, struct.pack("<I", 77)), 1))
    assert load_gguf(p).config["max_position_embeddings"] == 77


VALID_TOML = '''[[model]]
name = "a"
hub_id = "owner/a"
role = ["target", "drafter"]
family = "llama"
vocab = 96
size_mb = 1.5
default = true

[[model]]
name = "b"
local = "b.gguf"
role = ["drafter"]

[[pairing]]
target = "a"
drafter = "b"
vocab = "same"
default = true
'''


@FUZZ
@given(data=st.data())
def test_fuzz_models_toml_text(tmp_path, data):
    """Character-level mutations of a valid models.toml: a registry or a ConfigError."""
    text = list(VALID_TOML)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["delete", "insert", "replace"]))
        i = data.draw(st.integers(0, max(len(text) - 1, 0)))
        ch = data.draw(st.sampled_from(list('[]{}="#,.\n 0123456789abtrue-_') + [data.draw(st.characters())]))
        if op == "delete" and text:
            del text[i]
        elif op == "insert":
            text.insert(i, ch)
        elif text:
            text[i] = ch
    p = tmp_path / "models.toml"
    p.write_bytes("".join(text).encode("utf-8", errors="surrogatepass"))  # a lone surrogate: invalid UTF-8
    _load_or_specchat_error(lambda: load_registry(p))


@FUZZ
@given(raw=st.binary(max_size=300))
def test_fuzz_models_toml_bytes(tmp_path, raw):
    p = tmp_path / "models.toml"
    p.write_bytes(raw)
    _load_or_specchat_error(lambda: load_registry(p))


_TOML_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False), st.text(max_size=12),
              st.sampled_from(sorted(ROLES)), st.dates()),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)
_MODEL_KEYS = ["name", "hub_id", "alt_hub_id", "local", "revision", "role", "family", "tokenizer", "vocab", "tok_real",
               "params", "license", "format", "notes", "layout", "size_mb", "default"]
_PAIRING_KEYS = ["target", "drafter", "vocab", "note", "strategy", "default"]


@FUZZ
@given(models=st.lists(st.dictionaries(st.sampled_from(_MODEL_KEYS + ["colour"]), _TOML_VALUES, max_size=6), max_size=3),
       pairings=st.lists(st.dictionaries(st.sampled_from(_PAIRING_KEYS + ["speed"]), _TOML_VALUES, max_size=4), max_size=2),
       names=st.lists(st.sampled_from(["a", "b", ""]), max_size=3))
def test_fuzz_models_toml_structure(models, pairings, names):
    """Parsed TOML of any shape (keys right or wrong, values of any type) into parse_registry."""
    for m, n in zip(models, names):
        m.setdefault("name", n)
    data = {"model": [{k: v for k, v in m.items() if v is not None} for m in models],
            "pairing": [{k: v for k, v in p.items() if v is not None} for p in pairings]}
    _load_or_specchat_error(lambda: parse_registry(data, Path("fuzz/models.toml")))


@pytest.fixture(scope="module")
def bpe_tokenizer_dir(tmp_path_factory) -> Path:
    """A tiny byte-level BPE (merges, specials, a chat template) saved as tokenizer.json & co."""
    tokens, types, merges = tiny_vocab()
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 1,
          "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.padding_token_id": 0,
          "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"}
    d = tmp_path_factory.mktemp("bpe")
    Tokenizer.from_gguf(md).save(d)
    assert Tokenizer.from_hf_dir(d).encode(" the") == [tokens.index("Ġthe")]
    return d


_JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=8), st.sampled_from(["BPE", "WordPiece", "Unigram", "WordLevel", "ByteLevel", "Sequence",
                                                    "Metaspace", "<|im_end|>", "Ġ", "h e"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=5,
)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON tree (dict keys and list indices), the root excluded."""
    out = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        if len(out) < 4000:
            out.extend(_paths(v, prefix + (k,)))
    return out


def _mutate_json(obj: Any, data: st.DataObject, n: int) -> Any:
    for _ in range(n):
        paths = _paths(obj)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent = obj
        for k in path[:-1]:
            parent = parent[k]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(_JSON_VALUES)
    return obj


@FUZZ
@given(data=st.data())
def test_fuzz_tokenizer_json_structure(bpe_tokenizer_dir, tmp_path, data):
    """tokenizer.json with values replaced (any JSON type) or keys deleted anywhere in the tree."""
    d = copy_of(bpe_tokenizer_dir, tmp_path / "tok")
    tj = json.loads((d / "tokenizer.json").read_text())
    # the vocabulary is large and uniform: aim most mutations at the structure around it
    vocab = tj["model"].pop("vocab")
    tj = _mutate_json(tj, data, data.draw(st.integers(1, 3)))
    if isinstance(tj, dict) and isinstance(tj.get("model"), dict) and data.draw(st.booleans()):
        tj["model"]["vocab"] = vocab
    (d / "tokenizer.json").write_text(json.dumps(tj))
    _load_or_specchat_error(lambda: Tokenizer.from_hf_dir(d))


@FUZZ
@given(data=st.data())
def test_fuzz_tokenizer_side_files(bpe_tokenizer_dir, tmp_path, data):
    """tokenizer_config.json, generation_config.json, special_tokens_map.json and config.json with
    values of any type for the keys the loader reads."""
    d = copy_of(bpe_tokenizer_dir, tmp_path / "tok")
    keys = {"tokenizer_config.json": ["bos_token", "eos_token", "unk_token", "pad_token", "add_bos_token", "add_eos_token",
                                      "chat_template"],
            "generation_config.json": ["eos_token_id", "bos_token_id"],
            "special_tokens_map.json": ["bos_token", "eos_token", "unk_token", "pad_token"],
            "config.json": ["bos_token_id", "eos_token_id"]}
    for name, ks in keys.items():
        if data.draw(st.booleans()):
            obj = data.draw(st.one_of(st.dictionaries(st.sampled_from(ks), _JSON_VALUES, max_size=4), _JSON_VALUES))
            (d / name).write_text(json.dumps(obj))
    _load_or_specchat_error(lambda: Tokenizer.from_hf_dir(d))


@FUZZ
@given(data=st.data())
def test_fuzz_tokenizer_json_bytes(bpe_tokenizer_dir, tmp_path, data):
    """tokenizer.json cut short or with a few bytes overwritten."""
    d = copy_of(bpe_tokenizer_dir, tmp_path / "tok")
    raw = bytearray((d / "tokenizer.json").read_bytes())
    for _ in range(data.draw(st.integers(0, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.sampled_from(list(b'{}[]":,0 \\') + [0xFF, 0x00]))
    if data.draw(st.booleans()):
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    (d / "tokenizer.json").write_bytes(bytes(raw))
    _load_or_specchat_error(lambda: Tokenizer.from_hf_dir(d))


def test_a_missing_paired_drafter_loads_the_target_alone(tiny, tmp_path, capsys, monkeypatch):
    """A models.toml copied away from the repo (its relative `local` paths then point nowhere): the
    registry's paired drafter cannot load, and the chat starts with the target alone, saying why and
    where it looked; a drafter the user names fails as before. A missing SPECCHAT_MODELS file is an
    error, as --models is (it read as an empty registry)."""
    from engine.session import ChatSession

    toml = tmp_path / "m.toml"
    toml.write_text(f'''
[[model]]
name = "t"
local = "{tiny}"
role = ["target"]
default = true

[[model]]
name = "d"
local = "gone/drafter"
role = ["drafter"]

[[pairing]]
target = "t"
drafter = "d"
default = true
''')
    s = ChatSession.load(models_file=str(toml))
    assert s.drafter is None and s.strategy.name == "pld"
    assert "'d'" in s.drafter_error and str(tmp_path / "gone/drafter") in s.drafter_error
    assert "looked for" in api_error(ChatSession.load, models_file=str(toml), drafter="d")
    capsys.readouterr()
    assert main(["generate", "--models", str(toml), "--prompt-ids", "1,2,3", "--max-new-tokens", "3"]) == 0
    err = capsys.readouterr().err
    assert "warning: the paired drafter 'd' was not loaded" in err and "decoding without it" in err
    monkeypatch.setenv("SPECCHAT_MODELS", str(tmp_path / "nowhere.toml"))
    assert "models file not found (SPECCHAT_MODELS)" in cli_error(capsys, "models")
