"""hybrid:K's chain scorer (engine/chain_scorer.py): the features of a candidate, the choice it
makes in NgramDrafter.corpus_tree's chains, its file (shipped beside a drafter) and its refusals,
and losslessness: a scored chain is verified as any other, token for token plain greedy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import chain_scorer as cs
from engine.drafters.corpus import CorpusIndex
from engine.drafters.ngram import NgramDrafter
from engine.errors import SpecchatError
from engine.gate import AGREE, COPIED, MODEL
from engine.generate import run_generation
from engine.loading import load
from engine.strategy import from_spec

from .test_corpus import _FakeSpine, _mixed_setup
from .tiny import saved

REPO = Path(__file__).resolve().parents[1]


def _scorer(**w: float) -> cs.ChainScorer:
    return cs.ChainScorer(tuple(w.get(n, 0.0) for n in cs.NAMES), {})


def test_features_say_what_each_source_says_of_a_candidate():
    x = dict(zip(cs.NAMES, cs.features(copy_len=3, ds=(1, 0.4), ds_suffix=2, dr=(0, 0.7), dr_top_p=0.7, ds_top_share=0.5)))
    assert len(x) == cs.N == len(set(cs.NAMES))
    on = {k for k, v in x.items() if v}
    assert {"copy", "copy_len3", "ds", "ds_rank2", "ds_suffix2", "dr", "dr_rank1", "dr_p_bin3", "three_sources",
            "dr_and_other"} <= on
    assert not on & {"copy_len2", "copy_len4", "ds_rank1", "ds_suffix1", "dr_rank2", "dr_p_bin2"}
    assert x["ds_share"] == x["ds_share_suffix2"] == 0.4 and x["dr_p"] == 0.7 and x["dr_p_x_ds_share"] == pytest.approx(0.28)
    assert x["sources"] == 1.0 and x["copy_x_dr_top_p"] == 0.7 and x["ds_top_share"] == 0.5
    # a candidate only the drafter names; long copies and deep suffixes share the last bins
    y = dict(zip(cs.NAMES, cs.features(dr=(4, 1.0), dr_top_p=0.9)))
    assert y["dr_rank3+"] == y["dr_p_bin4"] == 1.0 and y["dr_and_other"] == 0.0 and y["sources"] == pytest.approx(1 / 3)
    assert not any(y[k] for k in ("copy", "ds", "ds_share", "three_sources"))
    z = dict(zip(cs.NAMES, cs.features(copy_len=9, ds=(0, 0.2), ds_suffix=7)))
    assert z["copy_len6+"] == z["ds_suffix4+"] == 1.0 and z["ds_share_suffix4+"] == 0.2


def test_a_scored_chain_drafts_the_candidate_the_scorer_prefers_at_each_depth():
    ix = CorpusIndex.build([([7, 8, 9, 10, 11, 12], 0)] * 3 + [([7, 8, 5], 0)], n_max=3, min_count=1)
    d = NgramDrafter(corpus=ix)
    table = {(): [(8, 0.7)], (8,): [(20, 0.9)], (8, 20): [(21, 0.8)], (8, 20, 21): [(22, 0.6)]}
    # a scorer that trusts the drafter: its chain; one that trusts the datastore: the datastore's
    sp = _FakeSpine(table)
    tree = d.corpus_tree([1, 7], max_nodes=4, spine=sp, chain=True, scorer=_scorer(dr=2.0, ds=1.0))
    assert tree.tokens == [8, 20, 21, 22] and tree.parents == [-1, 0, 1, 2] and sp.path == (8, 20, 21)
    # the nodes keep their confidence codes (the gate's calibration learns from them as before)
    assert tree.confidence[0] == pytest.approx(AGREE + 0.7) and tree.confidence[1] == pytest.approx(MODEL + 0.9)
    sp = _FakeSpine(table)
    tree = d.corpus_tree([1, 7], max_nodes=4, spine=sp, chain=True, scorer=_scorer(dr=1.0, ds=2.0))
    assert tree.tokens == [8, 9, 10, 11] and sp.path == (8, 9, 10)
    # the calibration is not consulted for the choice: one that would pick the datastore changes nothing
    sp = _FakeSpine(table)
    tree = d.corpus_tree([1, 7], max_nodes=4, calibrate=lambda c: 0.99 if c < MODEL else 0.01, spine=sp, chain=True,
                         scorer=_scorer(dr=2.0, ds=1.0))
    assert tree.tokens == [8, 20, 21, 22]
    # a scored chain has no cost cut; trees ignore the scorer
    with pytest.raises(ValueError, match="no cost cut"):
        d.corpus_tree([1, 7], max_nodes=4, spine=_FakeSpine(table), chain=True, scorer=_scorer(), worth=lambda *a: True)
    plain = d.corpus_tree([1, 7], max_nodes=6, spine=_FakeSpine(table))
    assert d.corpus_tree([1, 7], max_nodes=6, spine=_FakeSpine(table), scorer=_scorer(ds=9.0)).tokens == plain.tokens


def test_a_nan_drafter_probability_is_no_evidence_not_an_error():
    x = dict(zip(cs.NAMES, cs.features(dr=(0, float("nan")), dr_top_p=0.5)))
    assert x["dr"] == 1.0 and x["dr_p"] == 0.0 and x["dr_p_bin0"] == 1.0


def test_a_scored_chain_looks_again_where_the_history_cut_its_copy_short():
    """"9 1 2 1 2": the latest match of "1 2" copies the 2 tokens before the history's end; the
    chain then looks again from the context and the chain and goes on copying the repetition,
    its match length capped at ngram_max as a fresh lookup's is."""
    seen = []

    class Recording(cs.ChainScorer):
        def score(self, x):
            f = dict(zip(cs.NAMES, x))
            seen.append(next((n for n in cs.NAMES[1:6] if f[n]), None))
            return f["copy"]

    sc = Recording(tuple([0.0] * cs.N), {})
    tree = NgramDrafter().corpus_tree([9, 1, 2, 1, 2], max_nodes=5, chain=True, scorer=sc)
    assert tree.tokens == [1, 2, 1, 2, 1] and tree.confidence == [COPIED] * 5
    seen.clear()
    NgramDrafter().corpus_tree([9, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3], max_nodes=5, chain=True, scorer=sc, ngram_max=4)
    assert seen == ["copy_len3", "copy_len4", "copy_len4", "copy_len4", "copy_len4"]  # 3, then capped at 4


def test_a_scored_chain_sees_the_copy_grow_its_match_and_looks_again_off_it():
    seen = []

    class Recording(cs.ChainScorer):
        def score(self, x):
            f = dict(zip(cs.NAMES, x))
            seen.append(next((n for n in ("copy_len2", "copy_len3", "copy_len4", "copy_len5", "copy_len6+") if f[n]), None))
            return 5.0 * f["copy"] + f["dr_p"]

    sc = Recording(tuple([0.0] * cs.N), {})
    hist = [5, 1, 2, 3, 4, 6, 7, 9, 1, 2]  # "1 2" matched (2 tokens): the copy proposes 3, 4, 6 ...
    tree = NgramDrafter().corpus_tree(hist, max_nodes=3, chain=True, scorer=sc, spine=_FakeSpine({(): [(40, 0.9)]}))
    assert tree.tokens == [3, 4, 6] and tree.confidence == [COPIED] * 3
    assert [s for s in seen if s] == ["copy_len2", "copy_len3", "copy_len4"]  # the match grows along the copy
    # the drafter's token where the copy has nothing (the last token never occurred before)
    seen.clear()
    tree = NgramDrafter().corpus_tree([5, 1, 2, 8], max_nodes=1, chain=True, scorer=sc, spine=_FakeSpine({(): [(40, 0.9)]}))
    assert tree.tokens == [40] and seen == [None]


def test_scorer_files_round_trip_and_bad_ones_are_refused_in_one_line(tmp_path):
    sc = _scorer(copy=1.5, dr_p=-0.25)
    sc2 = cs.ChainScorer(sc.weights, {"fitted_on": "x"})
    sc2.save(tmp_path / cs.FILE)
    back = cs.scorer_of(tmp_path)
    assert back.weights == sc.weights and back.meta == {"fitted_on": "x"}
    assert cs.scorer_of(tmp_path / "nothing-here") is None
    good = json.loads((tmp_path / cs.FILE).read_text())
    bad = {
        "not json": "{",
        "a list": "[]",
        "format": json.dumps({**good, "format": "other"}),
        "features": json.dumps({**good, "features": good["features"][::-1]}),
        "short": json.dumps({**good, "weights": good["weights"][:-1]}),
        "nan": json.dumps({**good, "weights": [float("nan")] * cs.N}),
        "strings": json.dumps({**good, "weights": ["a"] * cs.N}),
        "a string": json.dumps({**good, "weights": "1" * cs.N}),
        "booleans": json.dumps({**good, "weights": [True] * cs.N}),
        "a dict": json.dumps({**good, "weights": {str(i): 1.0 for i in range(cs.N)}}),
        "features as a dict": json.dumps({**good, "features": {n: 1 for n in cs.NAMES}}),
        "no weights": json.dumps({k: v for k, v in good.items() if k != "weights"}),
        "a huge integer": json.dumps({**good, "weights": [10 ** 400] + [0.0] * (cs.N - 1)}),
        "deep nesting": '{"format": "specchat-chain-scorer-1", "x": ' + "[" * 100000 + "]" * 100000 + "}",
    }
    for name, text in bad.items():
        (tmp_path / cs.FILE).write_text(text)
        with pytest.raises(ValueError) as e:
            cs.scorer_of(tmp_path)
        assert "not a chain scorer" in str(e.value) and "\n" not in str(e.value), name


def test_a_drafter_loads_its_scorer_and_a_corrupt_one_is_a_clear_load_error(tmp_path):
    d = saved("draft", str(tmp_path))
    assert load(str(d)).model.chain_scorer is None
    _scorer(dr=1.0).save(Path(d) / cs.FILE)
    assert load(str(d)).model.chain_scorer.weights == _scorer(dr=1.0).weights
    (Path(d) / cs.FILE).write_text('{"format": "specchat-chain-scorer-1", "weights": [')
    with pytest.raises(SpecchatError) as e:
        load(str(d))
    assert "chain_scorer.json: not a chain scorer" in str(e.value) and "\n" not in str(e.value)


def test_the_shipped_drafter_ships_a_scorer_of_these_features():
    sc = cs.scorer_of(REPO / "assets/mamba-drafter-smollm2")
    assert sc is not None and len(sc.weights) == cs.N and sc.meta.get("fitted_on")


@pytest.mark.parametrize("target_kind, drafter_kind", [("llama", "draft"), ("mamba2", "draft")])
def test_hybrid_k_with_a_scorer_equals_plain_greedy(target_kind, drafter_kind, tmp_path, monkeypatch):
    """hybrid:K's scored chains, whatever the scorer prefers (the copy, the datastore, the drafter),
    with wrong and right datastores: token for token plain greedy; the scorer is what chose."""
    dec, prompts, wrong, right, refs = _mixed_setup(target_kind, drafter_kind, tmp_path)
    calls = []
    real = cs.ChainScorer.score
    monkeypatch.setattr(cs.ChainScorer, "score", lambda self, x: calls.append(1) or real(self, x))
    for sc in (_scorer(copy=3.0), _scorer(ds_share=3.0), _scorer(dr_p=3.0)):
        dec.drafter_model.chain_scorer = sc
        for ix in (wrong, right):
            dec.drafters["ngram"].corpus = ix
            for prompt in prompts:
                dec.reset()
                evs, _ = run_generation(dec, prompt, from_spec("hybrid:4"), 40)
                assert [t for e in evs for t in e.emitted] == refs[tuple(prompt)], (sc, prompt)
                # each drafting step tells the dashboard what ranked its chain and what it accepted
                pol = [e.policy for e in evs if e.drafted]
                assert pol and all(p["policy"] == "mixed chain" and p["ranked_by"] == "scorer" for p in pol)
                assert all(len(p["confidence"]) == e.drafted and p["accepted"] == e.accepted for p, e in
                           zip(pol, [e for e in evs if e.drafted]) if not e.finished)
    assert len(calls) > 100
    dec.drafter_model.chain_scorer = None  # without one: the gate's calibration, said so
    dec.reset()
    evs, _ = run_generation(dec, prompts[0], from_spec("hybrid:4"), 40)
    assert {e.policy["ranked_by"] for e in evs if e.drafted} == {"calibration"}


def test_the_fit_sees_the_candidates_and_features_a_chain_computes():
    """distill scorer's teacher-forced candidates (engine/distill_scorer.candidates) are the ones
    NgramDrafter.corpus_tree weighs at a chain's first depth, in its order, with its features."""
    from engine import distill_scorer as dsc

    ix = CorpusIndex.build([([7, 8, 9, 10, 11, 12], 0)] * 3 + [([7, 8, 5], 0), ([6, 7, 3], 0)], n_max=3, min_count=1)
    hist = [4, 7, 3, 1, 4, 7]  # "4 7" matched: the copy proposes 3; the datastore knows "7": 8, then 3
    seen = []

    class Recording(cs.ChainScorer):
        def score(self, x):
            seen.append(list(x))
            return 0.0

    d = NgramDrafter(corpus=ix)
    d.corpus_tree(hist, max_nodes=1, chain=True, scorer=Recording(tuple([0.0] * cs.N), {}),
                  spine=_FakeSpine({(): [(8, 0.6), (3, 0.3), (2, 0.05)]}))
    lens = []
    got = d.continuations(hist, 1, 1, 2, 6, lengths=lens)
    top, suffix = ix.top_suffix(hist[-3:], 3)
    f = {"y": 8, "copy": (got[0][0], lens[0]), "ds": top, "suffix": suffix, "dr": [(8, 0.6), (3, 0.3), (2, 0.05)]}
    cands = dsc.candidates(f)
    assert [t for t, _ in cands][:2] == [3, 8] and lens == [2] and suffix == 1
    assert [x for _, x in cands] == seen


def test_distill_scorer_refuses_a_drafter_that_is_not_a_directory(tmp_path, capsys, smollm2_gguf_path):
    from engine.cli import EXIT_ERROR, main

    argv = ["distill", "scorer", "--drafter", str(smollm2_gguf_path), "--datastore", str(REPO / "assets/ngram-smollm2.npz"),
            "--data", str(REPO / "assets/distill/smollm2-eval"), "--limit", "1"]
    assert main(argv) == EXIT_ERROR
    assert "HF-format drafter directory" in capsys.readouterr().err
    assert not list(Path(smollm2_gguf_path).parent.glob(cs.FILE))


def test_distill_scorer_fits_reports_held_out_folds_and_writes_a_loadable_scorer(tmp_path, capsys):
    from engine.cli import EXIT_ERROR, main

    out = tmp_path / "s.json"
    argv = ["distill", "scorer", "--drafter", str(REPO / "assets/mamba-drafter-smollm2"), "--datastore",
            str(REPO / "assets/ngram-smollm2.npz"), "--data", str(REPO / "assets/distill/smollm2-eval"), "--limit", "4",
            "--out", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "4 replies" in err and "fold 2/2 (held out)" in err
    sc = cs.ChainScorer.load(out)
    assert sc.meta["replies"] == 4 and len(sc.meta["held_out_folds"]) == 2 and any(sc.weights)
    # refusals: one line each, nothing written
    for extra, msg in ((["--folds", "0"], "--folds must be >= 1"), (["--out", str(tmp_path)], "is a directory"),
                       (["--ngram-min", "3", "--ngram-max", "2"], "n-gram sizes"),
                       (["--data", str(tmp_path / "none")], "no responses.jsonl")):
        assert main(argv + extra) == EXIT_ERROR
        assert msg in capsys.readouterr().err
    # a corrupt scorer in the drafter's directory fails its load in one line, and a refit replaces it
    d = tmp_path / "drafter"
    d.mkdir()
    for f in (REPO / "assets/mamba-drafter-smollm2").iterdir():
        if f.name != cs.FILE:
            (d / f.name).symlink_to(f)
    (d / cs.FILE).write_text("{")
    with pytest.raises(SpecchatError, match="not a chain scorer.*refit it"):
        load(str(d))
    refit = [a if a != str(REPO / "assets/mamba-drafter-smollm2") else str(d) for a in argv]
    refit = refit[:refit.index("--out")]
    assert main(refit) == 0 and load(str(d)).model.chain_scorer.meta["replies"] == 4
    other = tmp_path / "other.npz"
    CorpusIndex.build([([1, 2, 3], 0)], n_max=2, min_count=1, meta={"probe": [1, 2]}).save(other)
    assert main(argv + ["--datastore", str(other)]) == EXIT_ERROR
    assert "another tokenizer" in capsys.readouterr().err


def test_bench_settings_record_what_ranked_the_mixed_chains():
    from types import SimpleNamespace

    from engine.bench import _scorer_meta

    sc = cs.ChainScorer(tuple([0.0] * cs.N), {"fitted_on": "held-out", "positions": 7})
    with_it = SimpleNamespace(drafter=SimpleNamespace(model=SimpleNamespace(chain_scorer=sc)))
    assert _scorer_meta(with_it) == {"fitted_on": "held-out", "positions": 7}
    assert _scorer_meta(SimpleNamespace(drafter=None)) is None
    assert _scorer_meta(SimpleNamespace(drafter=SimpleNamespace(model=SimpleNamespace(chain_scorer=None)))) is None
