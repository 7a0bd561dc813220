"""The n-gram datastore of the target's own replies (engine/drafters/corpus.py) and pld:auto's
chains continued from it: counts, persistence, tokenizer check, drafting, losslessness."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.costmodel import fit
from engine.drafters.base import DraftRequest
from engine.drafters.corpus import PROBE_TEXT, CorpusIndex, _hash_py, _hash_windows
from engine.drafters.ngram import NgramDrafter
from engine.errors import SpecchatError
from engine.gate import COPIED, DraftGate
from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.strategy import from_spec, preset

from .tiny import saved

SEQS = [([1, 2, 3, 4, 5, 2, 3, 4, 6], 2), ([9, 2, 3, 4, 5], 1)]


def test_index_counts_the_most_frequent_next_token_per_context():
    ix = CorpusIndex.build(SEQS, n_max=3, min_count=1)
    assert ix.next([2, 3]) == (4, pytest.approx(3 / 4))  # [2,3] -> 4 three times (seq 1 twice, seq 2 once)
    assert ix.next([7, 3, 4]) == (5, pytest.approx(2 / 4))  # backs off to [3, 4]: 5 twice, 6 once
    assert ix.next([5, 2, 3, 4]) == (5, pytest.approx(2 / 4))  # the longest indexed suffix, [2, 3, 4]
    assert ix.next([8]) is None and ix.next([]) is None
    # positions before `start` are context only: seq 1's token 2 (position 1) is never a target
    assert ix.next([1]) is None
    # contexts of 2+ tokens seen once are dropped with min_count=2; 1-token contexts always stay
    pruned = CorpusIndex.build(SEQS, n_max=3, min_count=2)
    assert pruned.next([4, 5, 2]) == (3, pytest.approx(3 / 4))  # [4, 5, 2] and [5, 2] seen once: back to [2]
    assert len(pruned) < len(ix)
    for n in (1, 2, 3):  # the lookup's hash is the build's
        assert _hash_py([5, 6, 7][:n]) == int(_hash_windows(np.array([5, 6, 7][:n]), n)[0])


def test_index_round_trips_and_refuses_what_it_did_not_write(tmp_path):
    ix = CorpusIndex.build(SEQS, n_max=3, min_count=1, meta={"probe": [1, 2]})
    p = tmp_path / "ds.npz"
    ix.save(p)
    back = CorpusIndex.load(p)
    assert back.meta["probe"] == [1, 2] and back.meta["n_max"] == 3 and back.next([2, 3]) == ix.next([2, 3])
    with pytest.raises(SpecchatError, match="no such n-gram datastore"):
        CorpusIndex.load(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip at all")
    with pytest.raises(SpecchatError, match="not an n-gram datastore"):
        CorpusIndex.load(tmp_path / "junk.npz")
    np.savez(tmp_path / "other.npz", keys=np.arange(3, dtype=np.int64), tokens=np.arange(3), shares=np.ones(3),
             meta=np.frombuffer(json.dumps({"n_max": 3}).encode(), dtype=np.uint8))
    with pytest.raises(SpecchatError, match="bad arrays or metadata"):
        CorpusIndex.load(tmp_path / "other.npz")
    np.savez(tmp_path / "floats.npz", keys=np.arange(3, dtype=np.uint64), tokens=np.ones(3), shares=np.ones(3),
             meta=np.frombuffer(json.dumps({"n_max": 3}).encode(), dtype=np.uint8))
    with pytest.raises(SpecchatError, match="bad arrays or metadata"):
        CorpusIndex.load(tmp_path / "floats.npz")
    np.savez(tmp_path / "pickle.npz", keys=np.array([{}], dtype=object), tokens=np.arange(1), shares=np.ones(1),
             meta=np.frombuffer(b"{}", dtype=np.uint8))  # an object array would need pickle: refused
    with pytest.raises(SpecchatError, match="not an n-gram datastore"):
        CorpusIndex.load(tmp_path / "pickle.npz")


def test_index_keeps_the_top_continuations_best_first():
    ix = CorpusIndex.build(SEQS, n_max=3, min_count=1, branches=3)
    assert ix.top([7, 3, 4]) == [(5, pytest.approx(2 / 4)), (6, pytest.approx(1 / 4))]  # fewer than 3: no padding
    assert ix.top([7, 3, 4], 1) == [(5, pytest.approx(2 / 4))] and ix.next([7, 3, 4]) == (5, pytest.approx(0.5))
    assert ix.tokens.shape == (len(ix), 3) and ix.top([8]) == []
    one = CorpusIndex.build(SEQS, n_max=3, min_count=1, branches=1)
    assert one.tokens.shape == (len(one), 1) and one.top([7, 3, 4]) == [(5, pytest.approx(0.5))]


def test_trees_grow_best_first_from_the_copy_and_the_datastore():
    # 7 8 9 10 11 12 three times, 7 8 5 once: after [7, 8], 9 (share 3/5) and 5 (1/5)
    ix = CorpusIndex.build([([7, 8, 9, 10, 11, 12], 0)] * 3 + [([7, 8, 5], 0)], n_max=3, min_count=1)
    d = NgramDrafter(corpus=ix)
    tree = d.corpus_tree([1, 7], max_nodes=6)
    # best first by path probability: 8 (4/5 after [7]), then 9 under it (3/5), the 5 (1/5) later
    assert tree.tokens[:2] == [8, 9] and tree.parents[:2] == [-1, 0]
    assert 5 in tree.tokens and tree.parents[tree.tokens.index(5)] == 0  # the sibling of 9
    assert all(p < i for i, p in enumerate(tree.parents))  # topological: every prefix is a tree
    paths = {i: () for i in range(-1, 0)}
    for i, (t, p) in enumerate(zip(tree.tokens, tree.parents)):
        paths[i] = paths.get(p, ()) + (t,)
    reach = {-1: 1.0}
    for i, (c, p) in enumerate(zip(tree.confidence, tree.parents)):
        reach[i] = reach[p] * c
    order = [reach[i] for i in range(len(tree))]
    assert order == sorted(order, reverse=True)  # nodes come out in path-probability order
    # the context's copy (here [7, 8] occurred before: 1, 7, 8 follows) is a branch with COPIED confidence
    tree = d.corpus_tree([7, 8, 1, 7, 8], max_nodes=8)
    copied = [i for i, c in enumerate(tree.confidence) if c == COPIED]
    assert [tree.tokens[i] for i in copied] == [1, 7, 8] and tree.parents[copied[0]] == -1
    assert tree.tokens[:1] == [1]  # calibrated as 0.9: ahead of the datastore's 9 (3/5)
    # worth() stops growth: 8 (4/5), 9 under it (0.8 * 3/5 = 0.48), then 10 (0.48 * 3/4 = 0.36): below 0.4
    small = d.corpus_tree([1, 7], max_nodes=20, worth=lambda n, reach: reach > 0.4)
    assert small.tokens == [8, 9] and len(d.corpus_tree([1, 7], max_nodes=20)) > 5
    assert d.corpus_tree([1, 2], max_nodes=5).tokens == []  # nothing known
    # propose takes this path for a confidence request asking for the datastore
    req = DraftRequest(shape=(1,) * 4, confidence=True, corpus=True, max_nodes=3)
    assert d.propose([1, 7], req).tokens == tree.tokens[:0] + d.corpus_tree([1, 7], max_nodes=3).tokens
    assert d.propose([1, 7], DraftRequest(shape=(1,) * 4)).tokens == []  # plain prompt lookup


def test_gate_cuts_trees_by_path_probability_and_learns_from_judged_nodes():
    g = DraftGate(fit({1: 9.0, 2: 9.2, 4: 9.6, 8: 10.4, 16: 12.0}))  # nearly flat: a tree pays
    # root children 0 (p .9) and 1 (.5); 2 under 0 (.9); 3 under 1 (.9)
    conf, parents = [0.95, 0.55, 0.95, 0.95], [-1, -1, 0, 1]
    assert g._expected("ngram", conf, parents)[-1] == pytest.approx(1 + 0.95 + 0.55 + 0.95 * 0.95 + 0.55 * 0.95)
    assert g.choose("ngram", conf, 0.0, parents) == 4
    steep = DraftGate(fit({1: 9.0, 2: 14.0, 4: 30.0, 8: 60.0}))
    assert steep.choose("ngram", conf, 0.0, parents) == 0 or steep.choose("ngram", conf, 0.0, parents) == 1
    assert g.worth("ngram")(3, 0.9) and not steep.worth("ngram")(1, 0.3)
    # judged: the root's children and the children of accepted nodes; node 3 (under rejected 1) is not
    g.observe("ngram", depth=2, accepted=2, draft_ms=0.1, drafted=4, confidence=conf, parents=parents, path=[0, 2])
    b = g.sources["ngram"]
    assert b.cal_n[9] == 2.0 + 2 and b.cal_hits[9] == pytest.approx(2 * 0.95 + 2)  # nodes 0 and 2, both accepted
    assert b.cal_n[5] == 2.0 + 1 and b.cal_hits[5] == pytest.approx(2 * 0.55)  # node 1, rejected
    # the gate calibrates copied tokens in a bin of their own
    for _ in range(30):
        g.observe("ngram", depth=2, accepted=2, draft_ms=0.1, drafted=2, confidence=[COPIED, COPIED])
    assert g.calibrated("ngram", COPIED) > 0.9 and g.calibrated("ngram", 0.95) < 1.0


def _tiny_datastore(dec, prompts, n=40):
    """A datastore of the tiny target's own greedy replies (what `distill ngram` indexes)."""
    seqs = []
    for p in prompts:
        evs, _ = run_generation(dec, p, preset("ar"), n)
        seqs.append((list(p) + [t for e in evs for t in e.emitted], len(p)))
    return CorpusIndex.build(seqs, n_max=4, min_count=1)


def test_pld_auto_with_a_datastore_equals_plain_greedy(tmp_path, monkeypatch):
    target = load(str(saved("llama", str(tmp_path)))).model
    dec = Decoder(target)
    prompts = ([3, 1, 4, 1, 6], [9, 2, 6, 5, 3, 5], list(range(10, 30)))
    # a datastore of other replies (mostly wrong drafts), then one of these prompts' own (right ones)
    for train, right in (([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3], [5, 8, 9, 7, 9], [3, 2, 3, 8, 4]], False), (prompts, True)):
        ix = _tiny_datastore(dec, train)
        for prompt in prompts:
            ref = [t for e in run_generation(dec, prompt, preset("ar"), 40)[0] for t in e.emitted]
            dec.drafters["ngram"].corpus = ix
            evs, summ = run_generation(dec, prompt, from_spec("pld:auto"), 40)
            dec.drafters["ngram"].corpus = None
            assert [t for e in evs for t in e.emitted] == ref, (prompt, right)
    # what the gate drafts depends on measured step times; with a flat cost (a GPU-like curve, the
    # loop's own timings ignored) every right draft pays: trees are drafted, cut and accepted
    monkeypatch.setattr(DraftGate, "observe_step", lambda self, rows, ms: None)
    dec.verify_cost = fit({1: 1.0, 2: 1.0, 4: 1.01, 8: 1.02, 16: 1.04, 32: 1.08})
    for prompt in prompts:
        ref = [t for e in run_generation(dec, prompt, preset("ar"), 40)[0] for t in e.emitted]
        dec.reset()  # a new conversation: a new gate, on the flat cost
        dec.drafters["ngram"].corpus = ix
        evs, summ = run_generation(dec, prompt, from_spec("pld:auto"), 40)
        dec.drafters["ngram"].corpus = None
        assert [t for e in evs for t in e.emitted] == ref, prompt
        assert summ.accepted >= 10 and summ.accepted >= 0.6 * summ.drafted, (prompt, summ)
        assert any(e.policy and e.policy.get("confidence") and e.accepted for e in evs)


def test_session_attaches_the_registry_datastore_only_for_its_tokenizer(tmp_path, smollm2_gguf_path):
    from engine.session import ChatSession

    s = ChatSession.load(dtype="fp32", max_context=512)  # models.toml names assets/ngram-smollm2.npz
    assert s.datastore and s.datastore.endswith("ngram-smollm2.npz") and s.decoder.drafters["ngram"].corpus is not None
    assert s.decoder.drafters["ngram"].corpus.fits(s.tokenizer)
    s.attach_datastore("none")
    assert s.datastore is None and s.decoder.drafters["ngram"].corpus is None
    other = CorpusIndex.build(SEQS, n_max=2, min_count=1, meta={"probe": [1, 2, 3]})
    other.save(tmp_path / "other.npz")
    with pytest.raises(SpecchatError, match="built with another tokenizer"):
        s.attach_datastore(str(tmp_path / "other.npz"))
    assert s.decoder.drafters["ngram"].corpus is None
    mine = CorpusIndex.build(SEQS, n_max=2, min_count=1, meta={"probe": list(s.tokenizer.encode(PROBE_TEXT))})
    mine.save(tmp_path / "mine.npz")
    s.attach_datastore(str(tmp_path / "mine.npz"))
    assert s.datastore == str(tmp_path / "mine.npz")
    # the right tokenizer but a token the model does not have: refused before it could be drafted
    huge = CorpusIndex.build([([1, 2, 10 ** 6], 0)], n_max=2, min_count=1, meta={"probe": list(s.tokenizer.encode(PROBE_TEXT))})
    huge.save(tmp_path / "huge.npz")
    with pytest.raises(SpecchatError, match="outside smollm2-135m-instruct's vocabulary"):
        s.attach_datastore(str(tmp_path / "huge.npz"))
    assert s.decoder.drafters["ngram"].corpus is None
    # the registry's own datastore damaged: the session loads without it and says why
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 not really")
    toml = tmp_path / "models.toml"
    text = s.registry.path.read_text().replace('datastore = "assets/ngram-smollm2.npz"', f'datastore = "{tmp_path / "broken.npz"}"')
    assert str(tmp_path / "broken.npz") in text
    toml.write_text(text.replace('local = "assets/', f'local = "{s.registry.path.parent}/assets/'))
    s2 = ChatSession.load(dtype="fp32", max_context=512, models_file=str(toml), drafter="none")
    assert s2.datastore is None and "not an n-gram datastore" in s2.datastore_error


def test_distill_ngram_builds_a_datastore_the_cli_loads(tmp_path, smollm2_gguf_path, capsys):
    from engine.cli import main

    data = tmp_path / "data"
    assert main(["distill", "data", "--out", str(data), "--n", "3", "--max-new-tokens", "12"]) == 0
    out = tmp_path / "ds.npz"
    assert main(["distill", "ngram", "--data", str(data), "--out", str(out), "--n-max", "3", "--min-count", "1"]) == 0
    ix = CorpusIndex.load(out)
    assert ix.meta["replies"] == 3 and ix.meta["n_max"] == 3 and len(ix) > 0
    capsys.readouterr()
    rc = main(["generate", "Say hi.", "--strategy", "pld:auto", "--datastore", str(out), "--max-new-tokens", "8", "--json",
               "--max-context", "512"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["finish_reason"] in ("length", "eos")
    assert main(["generate", "Say hi.", "--datastore", str(tmp_path / "nope.npz"), "--max-new-tokens", "2"]) == 2
    assert "no such n-gram datastore" in capsys.readouterr().err
    assert main(["distill", "ngram", "--data", str(tmp_path), "--out", str(out)]) == 2  # no responses.jsonl
