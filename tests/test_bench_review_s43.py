"""Session 43's review of `specchat bench` as a user who measures with it daily: each test failed
before its fix (see the report).

- ``bench --strategy sd:7`` was accepted and silently ignored: the run measured the default
  ``ar,pld``;
- the same spec twice (``pld,pld``: an A/A run to see the noise) merged both into one label, the
  ALL row summing their tokens and times;
- ``--json`` did not record what a row's numbers depend on beyond the labels: the datastore
  ``pld:auto`` drafted from, the drafter's path, ``--max-context``, and each strategy's settings
  (``--draft-len 6 --strategies sd`` was recorded as ``sd``);
- a vocabulary bridge asked for (``sd:4@slrs``, ``--vocab tli``) with a drafter that shares the
  target's vocabulary was silently not used, the row still labelled ``sd:4@slrs``;
- the measuring modes (``--verify-cost``, ``--draft-cost``, ``--tree-scaling``) given together ran
  one of them silently, and each ignored ``--strategies`` / ``--prompts`` / ``--compare``;
- ``--tree-scaling --dtype q8`` measured fp32 (and ``auto`` took bf16 where bench's auto takes q8),
  ``--draft-cost`` labelled a q8 target ``torch.float32``;
- ``--tree-scaling`` said "stree is 0.84x faster than unrolled" of a slower stree.
"""

from __future__ import annotations

import json

import pytest

from engine import loading, session
from engine.cli import main

from .tiny import saved


from .test_cli_review_s42 import no_loading  # noqa: E402,F401 - its fixture: a model loaded fails the test


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tiny43"))
    return saved("llama", root), saved("draft", root)




def _bench(capsys, target, *extra):
    capsys.readouterr()
    argv = ["bench", "--target", str(target), "--prompt-ids", "1,5,9,3,5,9", "--warmup", "0", "--dtype", "fp32",
            "--max-new-tokens", "8", *extra]
    code = main(argv)
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err, cap.err
    return code, cap.out, cap.err


def _json(out):
    return json.loads(out.strip().splitlines()[-1])


def _one_error(code, err):
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("specchat:")]
    assert len(lines) == 1 and lines[0].startswith("specchat: error: "), err
    return lines[0]


# ---- --strategy in bench ------------------------------------------------------------------------------------------
def test_bench_strategy_alone_is_what_is_measured(tiny, capsys):
    code, out, err = _bench(capsys, tiny[0], "--drafter", str(tiny[1]), "--strategy", "sd:3", "--json")
    assert code == 0, err
    d = _json(out)
    assert d["settings"]["strategies"] == ["ar", "sd:3"]
    assert {r["strategy"] for r in d["rows"]} == {"ar", "sd:3"}


def test_bench_strategy_with_strategies_is_refused(tiny, capsys, no_loading):
    code, _, err = _bench(capsys, tiny[0], "--strategy", "sd:3", "--strategies", "ar,pld")
    assert "--strategies" in _one_error(code, err)


def test_bench_default_strategies_unchanged(tiny, capsys):
    code, out, err = _bench(capsys, tiny[0], "--json")
    assert code == 0, err
    assert _json(out)["settings"]["strategies"] == ["ar", "pld"]


# ---- the same spec twice ------------------------------------------------------------------------------------------
def test_a_spec_given_twice_gets_rows_of_its_own(tiny, capsys):
    code, out, err = _bench(capsys, tiny[0], "--strategies", "pld,pld", "--json")
    assert code == 0, err
    d = _json(out)
    assert d["settings"]["strategies"] == ["ar", "pld", "pld#2"]
    alls = {r["strategy"]: r for r in d["rows"] if r["prompt"] == "ALL"}
    assert set(alls) == {"ar", "pld", "pld#2"}
    assert alls["pld"]["new_tokens"] == alls["ar"]["new_tokens"] == alls["pld#2"]["new_tokens"]
    assert sum(1 for r in d["rows"] if r["strategy"] == "pld" and r["prompt"] == "ids") == 1


# ---- --json records what the numbers depend on -------------------------------------------------------------------
def test_json_records_each_strategys_settings_the_drafter_and_the_context(tiny, capsys):
    code, out, err = _bench(capsys, tiny[0], "--drafter", str(tiny[1]), "--strategies", "sd,tree:2-1",
                            "--draft-len", "6", "--max-context", "512", "--json")
    assert code == 0, err
    st = _json(out)["settings"]
    assert st["strategy_settings"]["sd"]["draft_len"] == 6
    assert st["strategy_settings"]["tree:2-1"]["tree"] == [2, 1]
    assert st["strategy_settings"]["ar"]["name"] == "ar"
    assert st["max_context"] == 512 and st["context_length"] == 512
    assert st["drafter"]["path"] == str(tiny[1].resolve())
    assert "datastore" in st and st["datastore"] is None
    assert st["prompt_ids"] == [1, 5, 9, 3, 5, 9]


def test_json_records_the_datastore_used(tiny, capsys, monkeypatch):
    from engine import bench

    monkeypatch.setattr(bench, "_datastore_of", lambda s: "/x/ngram.npz")
    code, out, err = _bench(capsys, tiny[0], "--strategies", "pld", "--json")
    assert code == 0, err
    assert _json(out)["settings"]["datastore"] == "/x/ngram.npz"


def test_datastore_of_a_session_is_its_path():
    from types import SimpleNamespace

    from engine.bench import _datastore_of

    assert _datastore_of(SimpleNamespace(datastore="/a/b.npz")) == "/a/b.npz"
    assert _datastore_of(SimpleNamespace(datastore=None)) is None


# ---- a bridge asked for where there is nothing to bridge ----------------------------------------------------------
@pytest.mark.parametrize("extra", [("--strategies", "sd:4@slrs"), ("--strategies", "sd:4", "--vocab", "tli")])
def test_a_bridge_with_a_same_vocab_drafter_is_refused_not_ignored(tiny, capsys, extra):
    code, _, err = _bench(capsys, tiny[0], "--drafter", str(tiny[1]), *extra)
    assert "vocabulary" in _one_error(code, err)


def test_generate_vocab_with_a_same_vocab_drafter_is_refused(tiny, capsys):
    capsys.readouterr()
    code = main(["generate", "--target", str(tiny[0]), "--drafter", str(tiny[1]), "--prompt-ids", "1,2,3",
                 "--dtype", "fp32", "--max-new-tokens", "4", "--strategy", "sd:3@slem"])
    err = capsys.readouterr().err
    assert "vocabulary" in _one_error(code, err)


# ---- the measuring modes ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, says", [
    (("--verify-cost", "--draft-cost"), "one of"),
    (("--verify-cost", "--tree-scaling"), "one of"),
    (("--verify-cost", "--strategies", "sd:4"), "--strategies"),
    (("--draft-cost", "--prompts", "p.txt"), "--prompts"),
    (("--tree-scaling", "--compare", "transformers"), "--compare"),
    (("--verify-cost", "--strategy", "sd:4"), "--strategy"),
])
def test_measuring_modes_refuse_what_they_would_ignore(capsys, no_loading, extra, says):
    capsys.readouterr()
    code = main(["bench", *extra])
    err = capsys.readouterr().err
    assert says in _one_error(code, err)


def test_tree_scaling_loads_the_compute_type_asked_for(tiny, monkeypatch, capsys):
    """--dtype q8 reached load() as torch.float32 (parse_dtype's q8 is fp32 'here'): the run measured
    fp32 under a q8 request; auto was decided without the model's type. load() decides both."""
    from engine import bench_ssm, cli

    seen = {}

    class Stop(Exception):
        pass

    def fake_load_target(args, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(cli, "load_target", fake_load_target)
    for dt in ("q8", "auto", "bf16"):
        seen.clear()
        args = cli.build_parser().parse_args(["bench", "--tree-scaling", "--target", str(tiny[0]), "--dtype", dt])
        with pytest.raises(Stop):
            bench_ssm.cmd_tree_scaling(args)
        assert seen["dtype"] == dt


def test_tree_scaling_q8_on_random_weights_is_refused(tmp_path, capsys):
    from .tiny import TINY

    (tmp_path / "c.json").write_text(json.dumps(TINY["llama"]))  # a small config: at HEAD this run measured fp32
    capsys.readouterr()
    code = main(["bench", "--tree-scaling", "--target", str(tmp_path / "c.json"), "--dtype", "q8"])
    assert "q8" in _one_error(code, capsys.readouterr().err)


def test_tree_scaling_says_slower_when_stree_is_slower():
    from engine.bench_ssm import _speed_line

    assert _speed_line(15, 10.0, 8.4) == "  15 nodes: stree is 1.19x slower than unrolled"
    assert _speed_line(63, 10.0, 48.5) == "  63 nodes: stree is 4.85x faster than unrolled"


def test_draft_cost_names_the_targets_compute_type(tiny, capsys):
    capsys.readouterr()
    code = main(["bench", "--draft-cost", "--target", str(tiny[0]), "--drafter", str(tiny[1]), "--dtype", "fp32", "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    d = _json(cap.out)
    assert d["target_dtype"] == "fp32" and "torch." not in cap.out


# ---- the ar baseline and the other rows' options ------------------------------------------------------------------
@pytest.mark.parametrize("extra", [("--vocab", "slem"), ("--vocab", "tli"), ("--verify", "mss"), ("--verify", "rs")])
def test_the_ar_baseline_does_not_take_the_drafters_options(extra):
    """bench adds ar itself, so `bench --vocab slem --strategies sd:8` (a byte drafter's bridge, as the
    README's `--vocab` says) and `--verify mss --strategies tree` failed every time: "--vocab slem
    bridges a drafter model of another vocabulary; plain decoding has no drafter vocabulary"."""
    from engine.bench import _strategy_of_spec
    from engine.cli import build_parser, strategy_from_args

    args = build_parser().parse_args(["bench", "--temperature", "0.7", *extra])
    s = _strategy_of_spec("ar", args, True, strategy_from_args)
    assert s.name == "ar" and s.vocab == "auto"
    assert (args.vocab, args.verify) == (extra[1] if extra[0] == "--vocab" else None, extra[1] if extra[0] == "--verify" else None)
    other = _strategy_of_spec("tree:2-1" if extra == ("--verify", "mss") else "sd:4", args, True, strategy_from_args)
    assert (other.vocab if extra[0] == "--vocab" else other.verify) == extra[1]


def test_verify_mss_runs_with_its_ar_baseline(tiny, capsys):
    code, out, err = _bench(capsys, tiny[0], "--drafter", str(tiny[1]), "--strategies", "tree:2-1", "--verify", "mss",
                            "--temperature", "0.7", "--json")
    assert code == 0, err
    st = _json(out)["settings"]["strategy_settings"]
    assert st["tree:2-1"]["verify"] == "mss" and st["ar"]["verify"] == "auto"


# ---- the lead's follow-ups of the review (each failed before its fix) ------------------------------------------------
def test_tree_scaling_refuses_a_config_too_big_to_build_before_taking_memory(tmp_path, capsys):
    """A config naming only its model_type took transformers' defaults (llama: 6.7B parameters) and
    built them in fp32 with random weights: the process took the machine's memory and died silently."""
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "llama"}')
    code = main(["bench", "--tree-scaling", "--target", str(cfg)])
    err = capsys.readouterr().err
    line = _one_error(code, err)
    assert "6.7B-parameter" in line and "no sizes" in line and "hidden_size" in line, line


def test_bench_rows_report_their_own_peak_memory(tiny, capsys, monkeypatch):
    """Every row reported the process's high-water mark so far (each strategy's peak the largest
    any earlier row reached); now each row's run starts its own peak, and ALL is its rows' most."""
    from engine import bench, generate

    resets = []
    real = generate.reset_peak_rss
    monkeypatch.setattr(bench, "reset_peak_rss", lambda: resets.append(1) or real())
    code, out, err = _bench(capsys, tiny[0], "--strategies", "pld,pld", "--json")
    assert code == 0, err
    d = _json(out)
    assert len(resets) == 3  # one a row: ar, pld, pld#2 on the one prompt
    for name in ("ar", "pld", "pld#2"):
        per = [r["peak_mem_mb"] for r in d["rows"] if r["strategy"] == name and r["prompt"] == "ids"]
        whole = next(r["peak_mem_mb"] for r in d["rows"] if r["strategy"] == name and r["prompt"] == "ALL")
        assert whole == max(per) > 0


def test_reset_peak_rss_restarts_the_peak_from_the_current_size():
    import numpy as np

    from engine.generate import reset_peak_rss, window_peak_rss_mb as peak_rss_mb

    if not reset_peak_rss():
        pytest.skip("no /proc/self/clear_refs here")
    buf = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, touched
    high = peak_rss_mb()
    del buf
    assert reset_peak_rss()
    assert peak_rss_mb() < high - 32


def test_an_unknown_peer_is_refused_before_the_model_loads(tiny, capsys, no_loading):
    code, _, err = _bench(capsys, tiny[0], "--compare", "transformers,lama.cpp")
    assert "unknown peer" in _one_error(code, err)


def test_generate_reports_tokens_per_s_on_the_decode_loops_wall_clock(tiny, capsys, monkeypatch):
    """generate's tokens/s summed the steps' own ms, bench's is the decode loop's wall clock: for the
    same run the two commands disagreed. Here the work between steps (a 30 ms pause after each
    event) counts, as it does in bench and for the reader."""
    import time as time_mod

    from engine.generate import Decoder

    real = Decoder.steps

    def slow(self, *a, **kw):  # type: ignore[no-untyped-def]
        for ev in real(self, *a, **kw):
            yield ev
            time_mod.sleep(0.03)

    monkeypatch.setattr(Decoder, "steps", slow)
    capsys.readouterr()
    code = main(["generate", "--target", str(tiny[0]), "--prompt-ids", "1,2,3", "--dtype", "fp32",
                 "--max-new-tokens", "6", "--ignore-eos", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    d = json.loads(out.strip().splitlines()[-1])
    assert len(d["token_ids"]) == 6
    assert d["tokens_per_s"] < 6 / (5 * 0.03), d["tokens_per_s"]  # at least 5 pauses between the 6 steps' events


def test_ctrl_c_before_the_first_prompt_ends_still_prints_json(tiny, capsys, monkeypatch):
    """--json printed nothing at all when Ctrl-C came before the first prompt was measured: a script
    reading stdout got no object to say the run was interrupted."""
    from engine import bench

    def interrupt(*a, **kw):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_generation", interrupt)
    code, out, err = _bench(capsys, tiny[0], "--json")
    assert code == 130, err
    d = _json(out)
    assert d["interrupted"] is True and d["rows"] == [] and d["settings"]["strategies"] == ["ar", "pld"]
    assert "0 of 1 prompts measured" in err
