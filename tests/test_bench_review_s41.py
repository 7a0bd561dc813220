"""Session 41's review of `specchat bench`: each test failed before its fix (see the report)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from engine.cli import main

from .tiny import saved


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tiny41"))
    return saved("llama", root), saved("draft", root)


def _bench(capsys, target, *extra):
    argv = ["bench", "--target", str(target), "--prompt-ids", "1,5,9,3,5,9", "--warmup", "0", "--dtype", "fp32", *extra]
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _rows(out):
    return json.loads(out.strip().splitlines()[-1])


def test_tokens_per_s_is_the_wall_clock_of_the_decode_loop(tiny, capsys, monkeypatch):
    """Our tok/s summed each step's own ms (draft + verify), leaving out the rest of the step
    (bookkeeping, detokenizing, the event) that a reader waits through and that the peers' clocks
    (wall time between llama.cpp's tokens, transformers' generate()) include: ~3% on SmolLM2 q8.
    Work between the steps' timed parts must count."""
    import engine.generate as gen

    real = gen.peak_rss_mb

    def slow_rss():  # called once a step while the StepEvent is built, outside the step's own ms
        time.sleep(0.005)
        return real()

    monkeypatch.setattr(gen, "peak_rss_mb", slow_rss)
    code, out, err = _bench(capsys, tiny[0], "--strategies", "ar", "--max-new-tokens", "20", "--json")
    assert code == 0, err
    row = next(r for r in _rows(out)["rows"] if r["strategy"] == "ar" and r["prompt"] == "ids")
    assert row["new_tokens"] == 20
    assert row["tokens_per_s"] < 1000 / 5, row  # each token cost at least the 5 ms between steps


def test_a_greedy_mismatch_is_loud_and_fails_the_run(tiny, capsys, monkeypatch):
    """A strategy whose greedy tokens differ from our `ar` broke the lossless guarantee, yet the run
    printed a "NO" in a column and exited 0 (scripts never noticed): it warns on stderr, naming the
    strategy and prompt, and exits 1 (the rows are still printed)."""
    from engine import bench

    real = bench.run_generation

    def corrupt(dec, ids, s, n, *a, **kw):
        evs, summ = real(dec, ids, s, n, *a, **kw)
        if s.name == "pld" and evs and evs[-1].emitted:
            evs[-1].emitted = evs[-1].emitted[:-1] + [(evs[-1].emitted[-1] + 1) % 96]
        return evs, summ

    monkeypatch.setattr(bench, "run_generation", corrupt)
    code, out, err = _bench(capsys, tiny[0], "--strategies", "ar,pld", "--max-new-tokens", "8", "--json")
    res = _rows(out)
    assert any(r["strategy"] == "pld" and r["identical_to_ar"] is False for r in res["rows"])
    assert code == 1, err
    assert "pld" in err and "ids" in err and "differ" in err, err


def test_compare_refuses_sampling_peers_decode_greedily(tiny, capsys, monkeypatch):
    """The peers decode greedily (do_sample=False, llama.cpp temp 0) whatever --temperature says:
    with --temperature 0.7 our sampled rows were compared with their greedy ones (our sampling
    costs more a step), speedup and all. Refused before anything runs."""
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **kw: started.append(a) or pytest.fail("a peer ran"))
    code, out, err = _bench(capsys, tiny[0], "--strategies", "ar", "--max-new-tokens", "4", "--temperature", "0.7",
                            "--compare", "transformers")
    assert code == 2 and "--temperature" in err and "greedy" in err, err
    assert out == "" and not started


@pytest.mark.parametrize("n,compare", [(0, None), (1, "transformers")])
def test_too_few_new_tokens_to_measure_is_refused(tiny, capsys, monkeypatch, n, compare):
    """--max-new-tokens 0 measured nothing and printed 0.0 tok/s, 0.00x rows (with --compare
    transformers it failed in the peer after our minutes); 1 with a peer: the peer's rate leaves its
    first token out (prefill), so its rows were 0.0 tok/s and its ALL row -0.0 (noise in t_n - t_1)."""
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **kw: pytest.fail("a peer ran"))
    code, out, err = _bench(capsys, tiny[0], "--strategies", "ar", "--max-new-tokens", str(n),
                            *(["--compare", compare] if compare else []))
    assert code == 2 and "--max-new-tokens" in err, err
    assert out == ""


def _fake_transformers(monkeypatch, results):
    real = subprocess.Popen

    class FakePopen:
        def __new__(cls, argv, **kw):  # the peer's child is faked; anything else (git) runs
            return super().__new__(cls) if argv[:2] == [sys.executable, "-c"] else real(argv, **kw)

        def __init__(self, argv, **kw):
            self.returncode = 0

        def communicate(self, job, timeout=None):
            lines = [json.dumps(r) for r in results] + [json.dumps({"version": "fake"})]
            return "\n".join(lines) + "\n", ""

    monkeypatch.setattr(subprocess, "Popen", FakePopen)


def test_a_peers_summary_counts_its_tokens_and_only_measured_rates(tiny, capsys, monkeypatch):
    """A peer's ALL row said n - 1 tokens a prompt (the tokens its rate counts) beside per-prompt
    rows saying n; and a prompt the peer ended at its first token (no rate: 0.0) added its t_n - t_1
    noise to the ALL time (a negative total printed -0.0 tok/s) and a 0.0 to the MEDIAN."""
    _fake_transformers(monkeypatch, [
        {"label": "ar", "name": "ids", "out": [1, 2, 3, 4, 5], "t1": 0.1, "tn": 0.5, "rss_mb": 9.0},
        {"label": "pld", "name": "ids", "out": [7], "t1": 0.1, "tn": 0.09, "rss_mb": 9.0},
    ])
    code, out, err = _bench(capsys, tiny[0], "--strategies", "ar", "--max-new-tokens", "5", "--compare", "transformers", "--json")
    assert code == 0, err
    rows = {(r["strategy"], r["prompt"]): r for r in _rows(out)["rows"] if r["engine"] == "transformers"}
    assert rows[("ar", "ids")]["new_tokens"] == 5 and rows[("ar", "ALL")]["new_tokens"] == 5
    assert rows[("ar", "ALL")]["tokens_per_s"] == pytest.approx(4 / 0.4, abs=0.01)
    assert rows[("pld", "ALL")]["new_tokens"] == 1
    assert rows[("pld", "ALL")]["tokens_per_s"] >= 0 and rows[("pld", "ALL")]["speedup"] >= 0


def test_json_records_the_settings_that_change_the_numbers(tiny, capsys, monkeypatch):
    """--json's settings lacked what a reader needs to reproduce or compare a run: the strategy
    specs, --top-p, --seed, --ignore-eos, --raw, the peers (their versions and dtype), the machine,
    torch's version and the commit measured."""
    _fake_transformers(monkeypatch, [{"label": "ar", "name": "ids", "out": [1, 2, 3], "t1": 0.1, "tn": 0.3, "rss_mb": 9.0}])
    code, out, err = _bench(capsys, tiny[0], "--strategies", "pld,ar", "--max-new-tokens", "3", "--ignore-eos",
                            "--compare", "transformers", "--json")
    assert code == 0, err
    s = _rows(out)["settings"]
    assert s["strategies"] == ["ar", "pld"]
    assert s["ignore_eos"] is True and s["raw"] is False and s["top_p"] == 1.0 and s["seed"] == 0
    assert s["peers"]["transformers"]["version"] == "fake" and s["peers"]["transformers"]["dtype"] == "fp32"
    assert s["machine"]["cpus"] >= 1 and s["machine"].get("arch")
    assert s["torch"] and "commit" in s


def test_prompt_names_are_unique(tmp_path):
    """Two prompts of one name (a .json naming prompts by kind) shared our `ar`'s output and rate in
    the peers' rows (ar_out[name], ar_tps[name]: the last one's), and their rows could not be told
    apart; a prompt named ALL or MEDIAN read as a summary row."""
    from engine.bench import load_prompts

    f = tmp_path / "p.json"
    f.write_text(json.dumps([{"name": "code", "text": "a"}, {"name": "code", "text": "b"}, {"name": "ALL", "text": "c"},
                             {"text": "d"}, {"name": "p3", "text": "e"}]))
    names = [p["name"] for p in load_prompts(f)]
    assert len(set(names)) == len(names) and "ALL" not in names and "MEDIAN" not in names
    assert names[0] == "code" and [p["text"] for p in load_prompts(f)] == ["a", "b", "c", "d", "e"]


def test_ctrl_c_in_one_peer_keeps_the_peers_measured_before_it(tiny, capsys, monkeypatch):
    """Ctrl-C during the second peer dropped every peer's rows, the first peer's finished ones too,
    while the message said only the second peer's were left out."""
    from engine import bench

    _fake_transformers(monkeypatch, [{"label": "ar", "name": "ids", "out": [1, 2, 3], "t1": 0.1, "tn": 0.3, "rss_mb": 9.0}])
    monkeypatch.setattr(bench, "_check_peers", lambda compare, session: ["transformers", "llama.cpp"])

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "_bench_llama_cpp", interrupted)
    code, out, err = _bench(capsys, tiny[0], "--strategies", "ar", "--max-new-tokens", "3", "--compare", "transformers", "--json")
    assert code == 130, err
    res = _rows(out)
    assert res["interrupted"] is True and "the llama.cpp peer's rows are left out" in err
    assert {(r["engine"], r["prompt"]) for r in res["rows"] if r["engine"] == "transformers"} == {
        ("transformers", p) for p in ("ids", "ALL", "MEDIAN")}
    assert "transformers" in res["settings"]["peers"]
