"""Session 44: session 43's found-not-fixed items of `specchat bench`; each test failed before its fix.

- ``--json`` recorded the compute type as torch names it (``"dtype": "bfloat16"``) beside the flag
  that produced it (``"dtype_arg": "bf16"``) and q8 in the flag's word: one vocabulary now, --dtype's;
- ``--tree-scaling`` printed a "USDT: ... profiler_start/stop" line on stderr for each of its six
  memory measurements (torch's profiler), and CPUAllocator warnings on SSM models;
- on a Transformer it printed the backtrack table (Snakes and Ladders' ways of advancing an SSM
  state) as if it measured an SSM state.
"""

from __future__ import annotations

import json

import pytest
import torch

from engine.cli import main
from engine.loading import dtype_flag

from .tiny import TINY, saved


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tiny44"))
    return saved("llama", root), saved("draft", root)


def test_dtype_flag_speaks_the_flags_words():
    assert dtype_flag("bfloat16") == "bf16" and dtype_flag(torch.bfloat16) == "bf16"
    assert dtype_flag("float32") == "fp32" and dtype_flag(torch.float32) == "fp32"
    assert dtype_flag("q8") == "q8"


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_bench_json_dtype_is_the_flag_that_reproduces_it(tiny, capsys, dt):
    code = main(["bench", "--target", str(tiny[0]), "--prompt-ids", "1,5,9,3,5,9", "--warmup", "0", "--dtype", dt,
                 "--strategies", "ar", "--max-new-tokens", "3", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    s = json.loads(out.strip().splitlines()[-1])["settings"]
    assert s["dtype"] == dt and s["dtype_arg"] == dt


def _config(tmp_path, kind):
    cfg = tmp_path / f"{kind}.json"
    cfg.write_text(json.dumps(dict(TINY[kind])))
    return cfg


@pytest.mark.parametrize("kind, ssm", [("llama", False), ("mamba2", True)])
def test_tree_scaling_is_quiet_and_says_whether_there_is_an_ssm_state(tmp_path, capfd, kind, ssm):
    cfg = _config(tmp_path, kind)
    code = main(["bench", "--tree-scaling", "--target", str(cfg), "--dtype", "fp32"])
    cap = capfd.readouterr()
    assert code == 0, cap.err
    assert "USDT" not in cap.err and "profiling started" not in cap.err, cap.err
    assert ("no SSM layers in this model" in cap.out) is (not ssm)
    assert "backtrack" in cap.out and "stree" in cap.out

    code = main(["bench", "--tree-scaling", "--target", str(cfg), "--dtype", "fp32", "--json"])
    cap = capfd.readouterr()
    assert code == 0 and "USDT" not in cap.err
    res = json.loads(cap.out.strip().splitlines()[-1])
    assert res["recurrent_state"] is ssm and res["dtype"] == "fp32"
    assert [r["mode"] for r in res["backtrack"]] == ["ar", "replay", "joint", "recompute"]


def test_the_profiler_filter_keeps_other_stderr_lines(capfd):
    """Only the profiler's own chatter is dropped: anything else written meanwhile comes back."""
    import os

    from engine.bench_ssm import _without_profiler_chatter

    with _without_profiler_chatter():
        os.write(2, b"USDT:2026 profiler_start\nreal warning\n")
    err = capfd.readouterr().err
    assert "real warning" in err and "USDT" not in err


def test_q8_without_blocks_to_multiply_is_said_not_silent(tiny, capsys):
    """--dtype q8 on an HF-format checkpoint ran fp32 with no word (only the JSON's dtype said it);
    now a warning line, as a drafter left out is (found by session 44's SSM review)."""
    from engine.loading import load
    from engine.session import load_warnings

    loaded = load(str(tiny[0]), dtype="q8")
    assert not loaded.act8 and "runs in fp32" in (loaded.note or "") and "HF-format" in loaded.note
    assert load(str(tiny[0]), dtype="fp32").note is None

    class S:
        target = loaded

    assert load_warnings(S())[0] == loaded.note
    code = main(["generate", "--target", str(tiny[0]), "--dtype", "q8", "--prompt-ids", "1,2", "--max-new-tokens", "2"])
    assert code == 0 and "warning: --dtype q8 multiplies a GGUF's quantised blocks" in capsys.readouterr().err
