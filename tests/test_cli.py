"""The CLI contract of issue 2 (later issues and external checks rely on it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
import types
import time

import pytest

from engine.cli import main

from .tiny import saved


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tiny"))
    return saved("llama", root), saved("draft", root)


def run_json(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out.strip().splitlines()[-1])


def test_generate_json_contract(tiny, capsys):
    target, drafter = tiny
    res = run_json(capsys, "generate", "--target", str(target), "--drafter", str(drafter), "--strategy", "tree",
                   "--tree", "2,2,1", "--prompt-ids", "1,5,9,3,5,9", "--max-new-tokens", "20", "--json")
    assert {"text", "token_ids", "steps", "tokens_per_s", "mean_accepted", "peak_mem_mb", "strategy"} <= set(res)
    assert len(res["token_ids"]) == 20
    assert all(set(s) == {"drafted", "accepted", "emitted", "tree_size", "ms"} for s in res["steps"])
    assert sum(s["emitted"] for s in res["steps"]) == 20
    assert all(s["emitted"] == s["accepted"] + 1 or s is res["steps"][-1] for s in res["steps"])
    assert res["mean_accepted"] == pytest.approx(20 / len(res["steps"]))
    assert res["strategy"]["name"] == "tree" and res["strategy"]["tree"] == [2, 2, 1]
    ar = run_json(capsys, "generate", "--target", str(target), "--strategy", "ar", "--prompt-ids", "1,5,9,3,5,9",
                  "--max-new-tokens", "20", "--json")
    assert ar["token_ids"] == res["token_ids"] and ar["mean_accepted"] == 1.0


def test_samples_and_seeds(tiny, capsys):
    target, _ = tiny
    res = run_json(capsys, "generate", "--target", str(target), "--prompt-ids", "4,4,4", "--temperature", "1.0",
                   "--seed", "7", "--samples", "6", "--max-new-tokens", "5", "--json")
    samples = [tuple(s["token_ids"]) for s in res["samples"]]
    assert len(samples) == 6 and len(set(samples)) > 1
    again = run_json(capsys, "generate", "--target", str(target), "--prompt-ids", "4,4,4", "--temperature", "1.0",
                     "--seed", "7", "--samples", "6", "--max-new-tokens", "5", "--json")
    assert [tuple(s["token_ids"]) for s in again["samples"]] == samples  # seeds S..S+N-1 are reproducible


def test_ersd_equals_race_ar_from_the_cli(tiny, capsys):
    target, drafter = tiny
    common = ["--target", str(target), "--prompt-ids", "1,2,3,1,2", "--temperature", "0.9", "--seed", "3", "--max-new-tokens", "24", "--json"]
    ar = run_json(capsys, "generate", "--strategy", "ar", "--verify", "race", *common)
    ersd = run_json(capsys, "generate", "--strategy", "ersd", "--drafter", str(drafter), *common)
    assert ersd["token_ids"] == ar["token_ids"]


@pytest.mark.parametrize("argv, message", [
    (["generate", "--target", "/nonexistent/model", "--prompt-ids", "1"], "no such file or directory"),
    (["generate", "--strategy", "mab", "--drafter", "ngram", "--prompt-ids", "1"], "chooses trees for a drafter model"),
    (["generate", "--vocab", "slrs", "--strategy", "pld", "--prompt-ids", "1"], "no drafter vocabulary"),
    (["generate", "--strategy", "sd", "--drafter", "none", "--prompt-ids", "1"], "needs a drafter model"),
    (["generate", "--tree", "3,x", "--strategy", "tree", "--drafter", "ngram", "--prompt-ids", "1"], "bad tree shape"),
    (["models", "--models", "/nonexistent/models.toml"], "models file not found"),
    (["generate", "--max-new-tokens", "abc", "--prompt-ids", "1"], "invalid int value"),  # argparse, one line too
    (["bogus-command"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tiny, capsys):
    if "--target" not in argv and argv[0] == "generate":
        argv = argv[:1] + ["--target", str(tiny[0])] + argv[1:]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err


def test_bad_models_toml_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "models.toml"
    bad.write_text('[[model]]\nname = "x"\nhub_id = "a/b"\n\n[[model]\nname = "y"\n')
    assert main(["models", "--models", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "line 5" in err
    bad.write_text('[[model]]\nname = "x"\nhub_id = "a/b"\ncolour = "red"\n')
    assert main(["models", "--models", str(bad)]) == 2
    assert "unknown key 'colour'" in capsys.readouterr().err
    bad.write_text('[[model]]\nname = "x"\nhub_id = "a/b"\n[[model]]\nname = "x"\nhub_id = "c/d"\n')
    assert main(["models", "--models", str(bad)]) == 2
    assert "duplicate model name 'x'" in capsys.readouterr().err
    bad.write_text('[[model]]\nname = "x"\nhub_id = "a/b"\ndefault = true\n[[model]]\nname = "y"\nhub_id = "c/d"\ndefault = true\n')
    assert main(["models", "--models", str(bad)]) == 2
    assert "2 models have default = true ('x', 'y'): one at most" in capsys.readouterr().err
    bad.write_text('[[model]]\nname = "x"\nhub_id = "a/b"\n[[model]]\nname = "y"\nhub_id = "c/d"\n[[model]]\nname = "z"\nhub_id = "e/f"\n'
                   '[[pairing]]\ntarget = "x"\ndrafter = "y"\ndefault = true\n[[pairing]]\ntarget = "x"\ndrafter = "z"\ndefault = true\n')
    assert main(["models", "--models", str(bad)]) == 2
    assert "a second default pairing for 'x'" in capsys.readouterr().err


def test_models_lists_the_offline_default(smollm2_gguf_path, capsys):
    res = run_json(capsys, "models", "--json")
    smol = next(m for m in res["models"] if m["name"] == "smollm2-135m-instruct")
    assert smol["available"] and smol["default"] and smol["path"].endswith(".gguf")
    assert any(not m["available"] for m in res["models"])  # hub-only entries are listed as not downloaded


@pytest.mark.slow  # ~30 s alone, three CLI model loads; CI's slow set runs it (the default suite nears 15 min)
def test_default_is_the_shipped_pairing_with_its_measured_strategy(smollm2_gguf_path, capsys):
    """With no --target / --drafter / --strategy, `generate` decodes SmolLM2 with the shipped
    Mamba-2 drafter and the pairing's strategy (models.toml: pld:auto); --drafter none falls back
    to prompt lookup, with the cost-aware draft length too."""
    res = run_json(capsys, "generate", "Say hi.", "--max-new-tokens", "4", "--json")
    assert res["strategy"]["name"] == "pld" and res["strategy"]["adaptive"]
    res = run_json(capsys, "generate", "Say hi.", "--max-new-tokens", "4", "--drafter", "none", "--json")
    assert res["strategy"]["name"] == "pld" and res["strategy"]["adaptive"]
    # --strategy takes bench's spec forms too
    res = run_json(capsys, "generate", "Say hi.", "--max-new-tokens", "4", "--strategy", "sd:3:auto", "--json")
    assert res["strategy"]["name"] == "sd" and res["strategy"]["draft_len"] == 3 and res["strategy"]["adaptive"]
    # a drafter named explicitly takes its own registered pairing's strategy (models.toml: sd:8 for
    # the shipped byte drafter, bridged), and its greedy output is plain decoding's
    res = run_json(capsys, "generate", "Say hi.", "--max-new-tokens", "12", "--drafter", "mamba-byte-drafter", "--json")
    assert res["strategy"]["name"] == "sd" and res["strategy"]["draft_len"] == 8
    plain = run_json(capsys, "generate", "Say hi.", "--max-new-tokens", "12", "--drafter", "none", "--strategy", "ar", "--json")
    assert res["text"] == plain["text"]


def _default_sigint() -> None:
    """In the child: SIGINT back to its default. A suite started as a background job of a
    non-interactive shell inherits SIGINT as ignored, and Python then never installs its handler:
    the child would ignore the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_flushes_partial_output_and_exits_130(smollm2_gguf_path):
    """SIGINT mid-generation (once text is streaming): partial text stays on stdout, exit 130.
    The real default model, plain decoding: filling its context takes minutes here (a 1-layer toy
    filled 8k tokens in seconds, before the signal landed, on a loaded machine)."""
    import select

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "generate", "--target", str(smollm2_gguf_path),
                             "--drafter", "none", "--strategy", "ar", "Tell me a long story.",
                             "--max-new-tokens", "900000", "--ignore-eos"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, preexec_fn=_default_sigint)
    ready, _, _ = select.select([proc.stdout], [], [], 120)  # wait for the first streamed bytes
    assert ready, "no output within 120 s"
    first = os.read(proc.stdout.fileno(), 64)
    time.sleep(0.2)
    assert proc.poll() is None, "finished before the signal"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert b"interrupted" in err and b"Traceback" not in err
    assert len(first + out) > 0


@pytest.mark.parametrize("extra", [["--strategy", "sd", "--draft-len", "3"],            # rs
                                   ["--strategy", "tree", "--tree", "2,2"],             # mss
                                   ["--strategy", "pld"],                               # membership
                                   ["--strategy", "ersd"]],                             # race
                         ids=["rs", "mss", "membership", "race"])
def test_samples_distribution_matches_plain_sampling(extra, tiny, capsys):
    """`--samples N` of a speculative strategy vs plain sampling: two-sample chi-square on the
    first two tokens (the CLI path of the lossless-sampling oracle)."""
    from .test_generate import _two_sample_p

    target, drafter = tiny
    common = ["--target", str(target), "--prompt-ids", "4,4,4,4", "--temperature", "1.0", "--max-new-tokens", "2",
              "--samples", "1200", "--json"]
    ref = run_json(capsys, "generate", "--strategy", "ar", "--seed", "0", *common)
    got = run_json(capsys, "generate", "--drafter", str(drafter), "--seed", "5000", *extra, *common)
    a = [tuple(s["token_ids"]) for s in ref["samples"]]
    b = [tuple(s["token_ids"]) for s in got["samples"]]
    assert _two_sample_p(a, b) > 1e-3


def test_bench_tree_scaling_json_contract(tmp_path, capsys):
    """`bench --tree-scaling` on a config.json alone (random weights): the issue-3 JSON shape."""
    cfg = tmp_path / "tiny-mamba2.json"
    cfg.write_text(json.dumps({"model_type": "mamba2", "vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 1, "num_heads": 4,
                               "head_dim": 16, "state_size": 8, "n_groups": 1, "expand": 2, "conv_kernel": 4}))
    res = run_json(capsys, "bench", "--tree-scaling", "--target", str(cfg), "--json")
    assert "random weights" in res["target"]
    got = {(r["mode"], r["nodes"]) for r in res["rows"]}
    assert got == {(m, n) for m in ("stree", "unrolled") for n in (15, 31, 63)}
    assert all(r["ms"] > 0 and r["peak_mem_mb"] >= 0 for r in res["rows"])
    unrolled63 = next(r for r in res["rows"] if r["mode"] == "unrolled" and r["nodes"] == 63)
    assert unrolled63["rows"] == 1 + 32 * 5  # root + 32 leaves x 5-node paths, tokens repeated
    stree63 = next(r for r in res["rows"] if r["mode"] == "stree" and r["nodes"] == 63)
    assert stree63["rows"] == 63
    assert [r["mode"] for r in res["backtrack"]] == ["ar", "replay", "joint", "recompute"]


def test_download_offline_is_one_line_and_exit_2(tmp_path):
    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path), HF_HUB_ETAG_TIMEOUT="2", HF_HUB_DOWNLOAD_TIMEOUT="2")
    r = subprocess.run([sys.executable, "-m", "engine.cli", "download", "some/model"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "cannot reach the Hugging Face Hub" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_bench_compares_strategy_variants_in_one_run(tmp_path, smollm2_gguf_path, capsys):
    """`bench --strategies` with NAME:PARAM variants: one row per strategy and prompt plus an ALL
    row (over all tokens) and a MEDIAN row (of the prompts' figures) each; greedy rows are checked
    against our own ar; ar is added when missing."""
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"name": "a", "text": "Say hi."}, {"name": "b", "text": "Count to five."}]))
    path = str(smollm2_gguf_path)
    res = run_json(capsys, "bench", "--target", path, "--drafter", path, "--prompts", str(prompts), "--strategies",
                   "tree:2-1,sd:2,mab,optimal:4", "--max-new-tokens", "6", "--warmup", "0", "--json")
    names = ["ar", "tree:2-1", "sd:2", "mab", "optimal:4"]
    assert [r["strategy"] for r in res["rows"] if r["prompt"] == "ALL"] == names
    assert {(r["strategy"], r["prompt"]) for r in res["rows"]} == {(s, p) for s in names for p in ("a", "b", "ALL", "MEDIAN")}
    for s in names:  # two prompts: the median is their mean
        a, b, med = ({r["prompt"]: r for r in res["rows"] if r["strategy"] == s}[p] for p in ("a", "b", "MEDIAN"))
        assert med["speedup"] == pytest.approx((a["speedup"] + b["speedup"]) / 2, abs=2e-3)
        assert med["mean_accepted"] == pytest.approx((a["mean_accepted"] + b["mean_accepted"]) / 2, abs=2e-3)
    assert all(r["identical_to_ar"] for r in res["rows"])
    assert all(r["mean_accepted"] >= 1 for r in res["rows"] if r["strategy"] != "ar")
    assert main(["bench", "--target", path, "--prompts", str(prompts), "--strategies", "ar:3", "--warmup", "0"]) == 2
    assert "takes no parameter" in capsys.readouterr().err


def test_bench_compare_peers_errors_are_one_line(tmp_path, smollm2_gguf_path, capsys, monkeypatch):
    """`--compare`: an unknown peer, llama.cpp without llama-cpp-python, and llama.cpp on a
    non-GGUF target are one-line errors (exit 2)."""
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"name": "a", "text": "Say hi."}]))
    common = ["bench", "--prompts", str(prompts), "--strategies", "ar", "--max-new-tokens", "2", "--warmup", "0"]
    assert main(common + ["--target", str(smollm2_gguf_path), "--compare", "vllm"]) == 2
    assert "unknown peer" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as if not installed
    assert main(common + ["--target", str(smollm2_gguf_path), "--compare", "llama.cpp"]) == 2
    err = capsys.readouterr().err
    assert "needs llama-cpp-python" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(__version__="stub"))
    target = saved("llama", str(tmp_path))
    assert main(["bench", "--target", str(target), "--prompt-ids", "1,2,3", "--strategies", "ar", "--max-new-tokens", "2",
                 "--warmup", "0", "--compare", "llama.cpp"]) == 2
    assert "needs a GGUF target" in capsys.readouterr().err


def test_bench_compare_llama_cpp_runs_the_same_gguf(tmp_path, smollm2_gguf_path, capsys):
    """With llama-cpp-python installed (the ``peers`` extra): a llama.cpp row per prompt plus ALL,
    greedy decoding of the same GGUF, tokens/s > 0."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (the peers extra) is not installed")
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"name": "a", "text": "Say hi."}, {"name": "b", "text": "Count to five."}]))
    res = run_json(capsys, "bench", "--target", str(smollm2_gguf_path), "--prompts", str(prompts), "--strategies", "ar",
                   "--max-new-tokens", "8", "--warmup", "0", "--compare", "llama.cpp", "--json")
    rows = [r for r in res["rows"] if r["engine"] == "llama.cpp"]
    assert {r["prompt"] for r in rows} == {"a", "b", "ALL", "MEDIAN"}
    assert all(r["tokens_per_s"] > 0 and r["new_tokens"] >= 2 for r in rows)


def test_bench_draft_cost_json(tmp_path, capsys):
    """`bench --draft-cost`: chain-of-5 vs (3,2,2,1,1) drafting time of a Mamba drafter."""
    target, drafter = saved("llama", str(tmp_path)), saved("mamba2", str(tmp_path))
    res = run_json(capsys, "bench", "--draft-cost", "--target", str(target), "--drafter", str(drafter), "--json")
    assert res["chain5_ms"] > 0 and res["tree32211_ms"] > 0
    assert res["ratio"] == pytest.approx(res["tree32211_ms"] / res["chain5_ms"], rel=1e-2)
    assert main(["bench", "--draft-cost", "--target", str(target)]) == 2
    assert "needs a drafter model" in capsys.readouterr().err


def test_headless_commands_spin_only_when_every_pass_is_in_torch():
    """engine/cli.spin_headless: active OpenMP waits only for headless commands on an idle machine
    whose passes all run in torch (bf16 without its C pass, or the C kernels off); never for the chat app, a loaded
    machine, or fp32 / auto with the C kernels, whose own pool a spinning torch team would starve."""
    from engine import native
    from engine.cli import spin_headless

    # bf16 runs in torch where its C pass (AVX-512 BF16) does not apply; decided without loading the
    # kernels (which would start OpenMP before the policy is set)
    assert spin_headless("bench", "bf16", {}, 0.1) == (not native.bf16_records_likely({}))
    assert native.bf16_records_likely({}) == native.bf16_records_on({}) or native.lib() is None
    assert spin_headless("bench", "bf16", {"SPECCHAT_NATIVE_BF16": "0"}, 0.1)
    assert not spin_headless("bench", "bf16", {"SPECCHAT_BF16_PATH": "scalar"}, 0.1) or native.lib() is None
    assert spin_headless("generate", "auto", {"SPECCHAT_NATIVE": "0"}, 0.1)
    assert not spin_headless("bench", "auto", {}, 0.1)
    assert not spin_headless("bench", "fp32", {"SPECCHAT_NATIVE": "1"}, 0.1)
    assert not spin_headless("bench", "bf16", {}, 1.5)
    assert not spin_headless("chat", "bf16", {"SPECCHAT_NATIVE": "0"}, 0.0)
    # `distill train` is all torch (a Mamba-2 in training): active waits whatever the kernels, when idle
    assert spin_headless("distill", None, {}, 0.1, torch_only=True)
    assert not spin_headless("distill", None, {}, 1.2, torch_only=True)
    assert not spin_headless("distill", None, {}, 0.1)


def test_idleness_is_measured_now_not_by_the_trailing_load_average(monkeypatch):
    """engine/cli.cpu_busy: the cores busy over a short sample (the 1-minute load average
    trails by minutes: `distill data && distill train` started training at ~2 and passive waits,
    half the speed); the load average where that cannot be read."""
    import psutil

    from engine import cli

    monkeypatch.setattr(psutil, "cpu_percent", lambda interval: 50.0)  # 1 core of 2 busy
    monkeypatch.setattr(cli.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cli.os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    assert cli.cpu_busy(0.0) == 1.0
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval: (_ for _ in ()).throw(OSError("no /proc")))
    assert cli.cpu_busy(0.0) == 3.0


def test_distill_keeps_bf16_in_torch(tmp_path, monkeypatch):
    """`distill data --batch N` (batched torch passes) runs with the bf16 C pass off unless
    SPECCHAT_NATIVE_BF16 says otherwise, and only while it runs (main() also runs in-process); only
    where torch's bf16 products are native (an AVX2 CPU keeps the C pass: 3x faster there)."""
    import os

    from engine import cli

    monkeypatch.setattr(cli, "torch_bf16_native", lambda: True)
    seen = []
    monkeypatch.setattr("engine.distill.cmd_distill", lambda args: seen.append(os.environ.get("SPECCHAT_NATIVE_BF16")) or 0)
    monkeypatch.setenv("SPECCHAT_NATIVE_BF16", "1")
    monkeypatch.delenv("SPECCHAT_NATIVE_BF16")  # teardown restores the original state
    assert cli.main(["distill", "data", "--out", str(tmp_path / "d")]) == 0
    assert seen == ["0"] and "SPECCHAT_NATIVE_BF16" not in os.environ
    assert cli.main(["distill", "data", "--out", str(tmp_path / "d"), "--batch", "1"]) == 0  # one reply at a time: the C pass
    assert seen == ["0", None]
    monkeypatch.setenv("SPECCHAT_NATIVE_BF16", "1")
    assert cli.main(["distill", "data", "--out", str(tmp_path / "d")]) == 0
    assert seen == ["0", None, "1"] and os.environ["SPECCHAT_NATIVE_BF16"] == "1"
    monkeypatch.delenv("SPECCHAT_NATIVE_BF16")
    monkeypatch.setattr(cli, "torch_bf16_native", lambda: False)
    assert cli.main(["distill", "data", "--out", str(tmp_path / "d")]) == 0  # AVX2: torch's bf16 converts in software
    assert seen == ["0", None, "1", None]


def test_torch_bf16_native_reads_the_cpu_flags(monkeypatch):
    from engine import cli, native

    for flags, want in (({"avx2", "fma"}, False), ({"avx2", "avx512_bf16"}, True), ({"amx_bf16", "avx2"}, True), (set(), False)):
        monkeypatch.setattr(native, "cpu_flags", lambda flags=flags: flags)
        assert cli.torch_bf16_native() is want


def test_active_waits_over_the_c_pass_get_a_one_line_warning():
    """engine/cli.pool_starved_warning: OMP_WAIT_POLICY=ACTIVE is named as the cause when the model
    runs on the C kernels' pool, and nothing is said otherwise."""
    from engine.cli import pool_starved_warning

    class CPass:
        def _native_table(self):
            return object()

    class TorchPass:
        def _native_table(self):
            return None

    msg = pool_starved_warning(CPass(), {"OMP_WAIT_POLICY": "active"})
    assert msg and msg.startswith("specchat: warning:") and "OMP_WAIT_POLICY=ACTIVE" in msg and "\n" not in msg
    assert pool_starved_warning(CPass(), {"OMP_WAIT_POLICY": "PASSIVE"}) is None
    assert pool_starved_warning(CPass(), {}) is None
    assert pool_starved_warning(TorchPass(), {"OMP_WAIT_POLICY": "ACTIVE"}) is None
    assert pool_starved_warning(object(), {"OMP_WAIT_POLICY": "ACTIVE"}) is None


def test_llama_cpp_peer_runs_before_our_model_loads_on_the_same_ids(monkeypatch, smollm2_gguf_path):
    """bench runs llama.cpp first (our torch threads, once started, spin on a core under ACTIVE for
    the rest of the process): the ids it decodes are the GGUF tokenizer's chat ids, the same the
    session encodes, and the rows later reuse that run instead of starting another."""
    import subprocess
    import sys as _sys
    import types
    from types import SimpleNamespace

    from engine import bench
    from engine.session import ChatSession

    jobs = []

    class FakePopen:
        def __init__(self, argv, env, **kw):
            self.returncode = 0

        def communicate(self, job, timeout=None):
            jobs.append(json.loads(job))
            lines = [json.dumps({"name": n, "out": [7, 8, 9], "secs": 0.02}) for n, _ in jobs[-1]["prompts"]]
            return "\n".join(lines + [json.dumps({"version": "fake"})]), ""

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    monkeypatch.setitem(_sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))
    prompts = [{"name": "a", "text": "Name a colour."}, {"name": "b", "text": "Count to three."}]
    args = SimpleNamespace(compare="transformers,llama.cpp", models=None, target=None, raw=False, ignore_eos=False,
                           max_new_tokens=5, temperature=0.0)
    early = bench.llama_cpp_first(args, prompts)
    assert early is not None and len(jobs) == 1 and jobs[0]["n"] == 5
    session = ChatSession.load(dtype="q8", drafter="none", max_context=256)
    encoded = [(p["name"], session.encode_chat([{"role": "user", "content": p["text"]}])) for p in prompts]
    assert early[0] == encoded and jobs[0]["prompts"] == [[n, ids] for n, ids in encoded]
    assert set(jobs[0]["eos"]) == session.decoder.eos_ids
    rows = bench._bench_llama_cpp(session, encoded, 5, args, {"a": 10.0, "b": 10.0}, {}, {}, early=early)
    assert len(jobs) == 1 and [r.prompt for r in rows] == ["a", "b"]  # the early run, not a second one
    bench._bench_llama_cpp(session, encoded[:1], 5, args, {"a": 10.0}, {}, {}, early=early)
    assert len(jobs) == 2  # other ids: run again
    assert bench.llama_cpp_first(SimpleNamespace(**{**vars(args), "compare": "transformers"}), prompts) is None


def test_llama_cpp_peer_runs_in_its_own_process_at_its_own_wait_policy(monkeypatch, smollm2_gguf_path):
    """The llama.cpp peer decodes in a child process with no OMP_WAIT_POLICY, neither the engine's
    PASSIVE default (shared libgomp: llama.cpp fell to ~41 tok/s from ~120 under it) nor an ACTIVE
    the user gave for our passes (37 vs 113); its per-prompt results become rows, failures
    one-line errors."""
    import subprocess
    from types import SimpleNamespace

    import engine
    from engine import bench
    from engine.errors import SpecchatError

    seen = {}

    class FakePopen:
        def __init__(self, argv, env, **kw):
            seen["env"], seen["argv"] = env, argv
            self.returncode = None

        def communicate(self, job, timeout=None):
            seen.setdefault("job", json.loads(job))
            ok = seen.get("ok", True)
            self.returncode = 0 if ok else 1
            lines = [json.dumps({"name": "a", "out": [5, 6, 7], "secs": 0.02, "rss_mb": 90.0}), json.dumps({"version": "fake"})]
            return ("\n".join(lines) + "\n" if ok else ""), ("" if ok else "Traceback\nRuntimeError: boom")

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    monkeypatch.setattr(engine, "USER_OMP_WAIT_POLICY", None)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    session = SimpleNamespace(target=SimpleNamespace(path=smollm2_gguf_path), decoder=SimpleNamespace(eos_ids={2}))
    args = SimpleNamespace(temperature=0.0)
    totals = {}
    rows = bench._bench_llama_cpp(session, [("a", [1, 2, 3])], 3, args, {"a": 100.0}, {"a": [5, 6, 7]}, totals)
    assert "OMP_WAIT_POLICY" not in seen["env"] and "import engine" not in seen["argv"][-1]
    monkeypatch.setattr(engine, "USER_OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    bench._bench_llama_cpp(session, [("a", [1, 2, 3])], 3, args, {"a": 100.0}, {"a": [5, 6, 7]}, {})
    assert "OMP_WAIT_POLICY" not in seen["env"]  # the user's ACTIVE was for our passes
    assert seen["job"]["prompts"] == [["a", [1, 2, 3]]] and seen["job"]["path"] == str(smollm2_gguf_path)
    assert len(rows) == 1 and rows[0].identical and abs(rows[0].tokens_per_s - 100.0) < 1e-6
    assert rows[0].peak_mem_mb == 90.0  # the child's own peak
    assert totals[("ar", "llama.cpp")][:2] == [2, 0.02]
    seen["ok"] = False
    with pytest.raises(SpecchatError, match="llama.cpp peer failed: RuntimeError: boom"):
        bench._bench_llama_cpp(session, [("a", [1, 2, 3])], 3, args, {"a": 100.0}, {"a": [5, 6, 7]}, {})


def test_a_peer_killed_by_a_signal_says_which():
    """A llama-cpp-python built for another CPU died of SIGILL with nothing on stderr: the error
    said "no output"; it names the signal (and what SIGILL means)."""
    from engine.bench import _child_failure

    assert _child_failure(-4, "").startswith("killed by SIGILL (an instruction this CPU lacks")
    assert _child_failure(-9, "Loading...\n") == "killed by SIGKILL: Loading..."
    assert _child_failure(1, "x\nRuntimeError: boom\n") == "RuntimeError: boom"
    assert _child_failure(3, "") == "exit status 3, no output" and _child_failure(0, "") == "no output"


def test_generate_takes_a_system_prompt(smollm2_gguf_path, capsys, monkeypatch):
    from engine.session import ChatSession

    seen = []
    encode = ChatSession.encode_chat
    monkeypatch.setattr(ChatSession, "encode_chat", lambda self, messages: seen.append(messages) or encode(self, messages))
    assert main(["generate", "Hi", "--system", "Be terse.", "--max-new-tokens", "2", "--drafter", "none",
                 "--max-context", "256"]) == 0
    assert seen[-1] == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    capsys.readouterr()
    assert main(["generate", "Hi", "--raw", "--system", "x", "--max-new-tokens", "2", "--drafter", "none"]) == 2
    assert "--system needs the chat template" in capsys.readouterr().err


def test_bench_compare_transformers_skips_what_transformers_refuses(tmp_path, capsys):
    """transformers (in a child process at OpenMP's own wait policy) refused prompt lookup for a
    stateful (Mamba) model before 5.25 (which runs it): that peer row is skipped with a note; the
    run's results (ours, and transformers' plain decoding) are printed, not lost."""
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"name": "a", "text": "Say hi."}]))
    drafter = str(Path(__file__).resolve().parents[1] / "assets" / "mamba-drafter-smollm2")
    capsys.readouterr()
    assert main(["bench", "--target", drafter, "--drafter", "none", "--prompts", str(prompts), "--strategies", "ar",
                 "--max-new-tokens", "4", "--warmup", "0", "--compare", "transformers", "--json"]) == 0
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    engines = {(r["strategy"], r["engine"]) for r in res["rows"]}
    assert ("ar", "transformers") in engines and "(transformers, own process)" in cap.err
    # (either transformers ran it, or it refused and the row is skipped with a note)
    assert (("pld", "transformers") in engines) != ("transformers pld skipped" in cap.err)
    peer = next(r for r in res["rows"] if r["engine"] == "transformers" and r["prompt"] == "a")
    assert peer["peak_mem_mb"] > 0  # the child's own peak


def test_samples_print_as_they_finish_and_ctrl_c_keeps_them(tiny, capsys, monkeypatch):
    """`--samples`: each sample is printed when it finishes; Ctrl-C during the third keeps the two
    finished ones and the third's tokens so far (finish "interrupted"), exit 130 (it printed nothing)."""
    from engine.generate import Decoder

    steps = Decoder.steps
    calls = []

    def interrupting(self, *a, **kw):
        calls.append(1)
        for j, ev in enumerate(steps(self, *a, **kw)):
            if len(calls) == 3 and j == 2:
                raise KeyboardInterrupt
            yield ev

    monkeypatch.setattr(Decoder, "steps", interrupting)
    argv = ["generate", "--target", str(tiny[0]), "--prompt-ids", "1,2,3", "--temperature", "0.8", "--seed", "7",
            "--samples", "5", "--max-new-tokens", "6", "--ignore-eos"]
    capsys.readouterr()
    assert main(argv + ["--json"]) == 130
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    assert res["interrupted"] and [s["seed"] for s in res["samples"]] == [7, 8, 9]
    assert [len(s["token_ids"]) for s in res["samples"]][:2] == [6, 6] and len(res["samples"][2]["token_ids"]) >= 2
    assert [s["finish_reason"] for s in res["samples"]] == ["length", "length", "interrupted"]
    assert "2 of 5 samples finished" in cap.err
    calls.clear()
    assert main(argv) == 130
    out = capsys.readouterr().out
    assert out.count("--- sample seed") == 3 and "finish interrupted" in out


def test_ctrl_c_during_a_download_waiting_on_the_network_is_a_cancel(capsys, monkeypatch):
    """Ctrl-C while the download waits on a server that does not answer: the worker then fails with
    the network's timeout, and that is still a cancel (exit 130, "cancelled"), not an error (exit 2).
    The Ctrl-C is raised where the main thread waits for the worker (a real SIGINT does not reach a
    test thread under xdist)."""
    import threading

    from engine import hub

    class InterruptedOnce(threading.Event):
        fired = False

        def wait(self, timeout=None):
            if timeout == 0.1 and not InterruptedOnce.fired:  # cmd_download's polling wait
                InterruptedOnce.fired = True
                raise KeyboardInterrupt
            return super().wait(timeout)

    def hanging(repo, revision, progress=None, cancel=None, include=None):
        assert cancel.wait(10)
        raise hub.DownloadError(f"{repo}: cannot reach the Hub (offline? timed out)")

    monkeypatch.setattr(hub, "download", hanging)
    monkeypatch.setattr(threading, "Event", InterruptedOnce)
    capsys.readouterr()
    assert main(["download", "some/repo"]) == 130
    err = capsys.readouterr().err
    assert "download of some/repo cancelled" in err and "timed out" not in err


def test_chat_takes_the_strategy_in_benchs_spec_forms(monkeypatch, capsys):
    """`specchat chat --strategy sd:auto` (the forms bench and generate take) starts the app with
    that strategy; it said "unknown strategy 'sd:auto'". A bad spec is one line, before the UI."""
    import app.main

    from engine.cli import main
    from engine.strategy import from_spec

    seen = {}
    monkeypatch.setattr(app.main, "run_app", lambda factory, **kw: seen.update(kw))
    for spec in ("sd:auto", "tree:3-2-1", "pld", "sd:3:auto"):
        assert main(["chat", "--strategy", spec]) == 0
        assert seen["initial_strategy"] == from_spec(spec)
    seen.clear()
    assert main(["chat", "--strategy", "sd:x"]) != 0
    err = capsys.readouterr().err.strip()
    assert not seen and len(err.splitlines()) == 1 and "sd:x" in err and "Traceback" not in err
