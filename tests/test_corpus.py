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
    for bad in (np.nan, -0.5, 2.0):  # a share is a frequency: NaN stopped a reply mid-way ("cannot convert float NaN")
        np.savez(tmp_path / "shares.npz", keys=np.arange(3, dtype=np.uint64), tokens=np.arange(3),
                 shares=np.array([0.5, bad, 0.25], dtype=np.float32), meta=np.frombuffer(json.dumps({"n_max": 3}).encode(), dtype=np.uint8))
        with pytest.raises(SpecchatError, match=r"shares outside \[0, 1\]"):
            CorpusIndex.load(tmp_path / "shares.npz")
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
        assert all(e.strategy.startswith("pld tree<=16 auto") for e in evs)
        # the gate's panel: the tree's node cap, never fewer than the nodes it kept ("k = 15 of 8")
        assert all(e.policy["k_max"] == 16 and e.policy["k"] <= e.policy["k_max"] for e in evs if e.policy)


def test_session_attaches_the_registry_datastore_only_for_its_tokenizer(tmp_path, smollm2_gguf_path):
    from engine.session import ChatSession

    s = ChatSession.load(dtype="fp32", max_context=512)  # models.toml names assets/ngram-smollm2.npz
    assert (s.strategy.name, s.strategy.adaptive) == ("pld", True)
    assert s.datastore and s.datastore.endswith("ngram-smollm2.npz") and s.decoder.drafters["ngram"].corpus is not None
    assert s.decoder.drafters["ngram"].corpus.fits(s.tokenizer)
    # the status line's label is the one the steps carry: datastore trees, not chains of draft_len
    from engine.session import strategy_label

    assert strategy_label(s).startswith("pld tree<=16 auto")
    assert strategy_label(s, from_spec("pld:3")).startswith("pld k=3")  # fixed: chains
    s.attach_datastore("none")
    assert s.datastore is None and s.decoder.drafters["ngram"].corpus is None
    assert strategy_label(s).startswith("pld k<=8 auto")  # prompt lookup alone drafts chains
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


@pytest.mark.slow  # ~30 s alone, three CLI model loads; CI's slow set runs it (the default suite nears 15 min)
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
    # several sets are indexed together (a set shipped as responses.jsonl.xz among them)
    import lzma

    packed = tmp_path / "packed"
    packed.mkdir()
    with lzma.open(packed / "responses.jsonl.xz", "wt") as f:
        f.write((data / "responses.jsonl").read_text())
    both = tmp_path / "both.npz"
    assert main(["distill", "ngram", "--data", str(data), str(packed), "--out", str(both), "--n-max", "3", "--min-count", "1"]) == 0
    assert CorpusIndex.load(both).meta["replies"] == 6


class _FakeSpine:
    """A drafter model along one path (engine/drafters/model.Spine's interface): proposes by a
    table of path -> [(token, p)], records the tokens it was stepped with."""

    def __init__(self, table, room=99, ms=0.5):
        self.table, self.room, self.ms, self.path = table, room, ms, ()

    def candidates(self):
        return self.table.get(self.path, [])

    def can_advance(self):
        return len(self.path) < self.room

    def advance(self, token):
        self.path += (token,)


def test_mixed_trees_add_the_drafter_model_along_the_path_the_tree_takes():
    from engine.gate import AGREE, MODEL

    ix = CorpusIndex.build([([7, 8, 9, 10, 11, 12], 0)] * 3 + [([7, 8, 5], 0)], n_max=3, min_count=1)
    d = NgramDrafter(corpus=ix)
    # the drafter agrees on 8, then proposes 20 (the datastore's 9 under it too), then 21 under 20
    sp = _FakeSpine({(): [(8, 0.7), (3, 0.2)], (8,): [(20, 0.9), (9, 0.05)], (8, 20): [(21, 0.8)]})
    tree = d.corpus_tree([1, 7], max_nodes=8, spine=sp)
    conf = dict(zip(zip(tree.parents, tree.tokens), tree.confidence))
    assert conf[(-1, 8)] == pytest.approx(AGREE + 0.7)  # drafter and datastore both proposed it
    assert conf[(-1, 3)] == pytest.approx(MODEL + 0.2)  # only the drafter
    assert conf[(0, 20)] == pytest.approx(MODEL + 0.9) and conf[(0, 9)] == pytest.approx(AGREE + 0.05)
    i20 = tree.tokens.index(20)
    assert tree.tokens[tree.parents.index(i20)] == 21  # the drafter followed 20, the path's best child
    assert sp.path[:2] == (8, 20)  # stepped once per path node, in path order
    assert all(p < i for i, p in enumerate(tree.parents))
    # without a spine: the datastore's tree, no drafter codes
    assert all(c < MODEL for c in d.corpus_tree([1, 7], max_nodes=8).confidence)
    # a drafter step that cannot pay (worth with the step's ms) ends the path: no candidates below the root's
    sp = _FakeSpine({(): [(8, 0.7)], (8,): [(20, 0.9)]}, ms=5.0)
    tree = d.corpus_tree([1, 7], max_nodes=8, spine=sp, worth=lambda n, reach, step_ms=0.0: step_ms < 1.0)
    assert sp.path == () and 20 not in tree.tokens
    # nor past the drafter's room
    sp = _FakeSpine({(): [(8, 0.7)], (8,): [(20, 0.9)]}, room=0)
    assert 20 not in d.corpus_tree([1, 7], max_nodes=8, spine=sp).tokens and sp.path == ()


def _mixed_setup(target_kind, drafter_kind, tmp_path):
    """A tiny target and drafter, three prompts, a datastore of other replies (wrong drafts) and
    one of these prompts' own (right ones), and plain greedy's replies."""
    target = load(str(saved(target_kind, str(tmp_path)))).model
    dec = Decoder(target, load(str(saved(drafter_kind, str(tmp_path)))).model)
    prompts = ([3, 1, 4, 1, 6], [9, 2, 6, 5, 3, 5], list(range(10, 30)))
    wrong = _tiny_datastore(dec, [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3], [5, 8, 9, 7, 9], [3, 2, 3, 8, 4]])
    right = _tiny_datastore(dec, prompts)
    refs = {tuple(p): [t for e in run_generation(dec, p, preset("ar"), 40)[0] for t in e.emitted] for p in prompts}
    return dec, prompts, wrong, right, refs


def test_mixed_chains_take_the_likeliest_calibrated_source_at_each_depth():
    """corpus_tree(chain=True), hybrid:K's draft: one node a depth, the best calibrated candidate
    among the children of the last; the drafter steps along every node but the last."""
    from engine.gate import AGREE, MODEL

    ix = CorpusIndex.build([([7, 8, 9, 10, 11, 12], 0)] * 3 + [([7, 8, 5], 0)], n_max=3, min_count=1)
    d = NgramDrafter(corpus=ix)
    table = {(): [(8, 0.7)], (8,): [(20, 0.9)], (8, 20): [(21, 0.8)], (8, 20, 21): [(22, 0.6)]}

    def trusting(c):  # the drafter as calibrated as the datastore; agreement all but sure
        return 0.99 if c >= AGREE else (c - MODEL if c >= MODEL else (0.3 if c == COPIED else c))

    sp = _FakeSpine(table)
    tree = d.corpus_tree([1, 7], max_nodes=4, calibrate=trusting, spine=sp, chain=True)
    assert tree.tokens == [8, 20, 21, 22] and tree.parents == [-1, 0, 1, 2]
    assert tree.confidence[0] == pytest.approx(AGREE + 0.7) and tree.confidence[1] == pytest.approx(MODEL + 0.9)
    assert sp.path == (8, 20, 21)  # no step after the last node: nothing would use its proposals
    # a drafter worth half its probability: the datastore's 9 (share 0.75) beats its 20 (0.45), and
    # the chain goes on from the datastore where the drafter has nothing to say
    sp = _FakeSpine(table)
    tree = d.corpus_tree([1, 7], max_nodes=4, calibrate=lambda c: trusting(c) / 2 if MODEL <= c < AGREE else trusting(c),
                         spine=sp, chain=True)
    assert tree.tokens == [8, 9, 10, 11] and tree.parents == [-1, 0, 1, 2] and sp.path == (8, 9, 10)
    # a tree from the same candidates branches; the chain never does
    assert len(set(d.corpus_tree([1, 7], max_nodes=6, calibrate=trusting, spine=_FakeSpine(table)).parents)) < 6
    # off the context's match, the copy is looked up again from the context and the chain: 50 (the
    # drafter's) leaves the copy of "3" (60 61 ...), and "3 50" occurred: 51 is copied next
    plain = NgramDrafter()
    hist = [3, 50, 51, 52, 3, 60, 61, 3]
    sp = _FakeSpine({(): [(50, 0.9)], (50,): [(70, 0.1)], (50, 51): [(71, 0.1)]})
    tree = plain.corpus_tree(hist, max_nodes=3, calibrate=trusting, spine=sp, chain=True, ngram_min=1)
    assert tree.tokens == [50, 51, 52] and tree.confidence[1:] == [COPIED, COPIED]
    # a chain stops where no source proposes anything
    assert NgramDrafter().corpus_tree([1, 2, 3], max_nodes=4, chain=True).tokens == []


@pytest.mark.parametrize("target_kind, drafter_kind", [("llama", "draft"), ("mamba2", "draft"), ("llama", "mamba2")])
def test_hybrid_k_mixed_chains_equal_plain_greedy_and_learn_their_calibration(target_kind, drafter_kind, tmp_path):
    """hybrid:K, greedy, with a datastore: chains of K mixing the copy, the datastore and the
    drafter model per token: token for token plain greedy with wrong and right datastores, on
    attention and SSM targets; the verified chains teach the gate's "chain" calibration."""
    dec, prompts, wrong, right, refs = _mixed_setup(target_kind, drafter_kind, tmp_path)
    for ix in (wrong, right):
        dec.drafters["ngram"].corpus = ix
        accepted = 0
        for prompt in prompts:
            dec.reset()
            evs, summ = run_generation(dec, prompt, from_spec("hybrid:4"), 40)
            assert [t for e in evs for t in e.emitted] == refs[tuple(prompt)], prompt
            assert all(e.drafted <= 4 and e.tree_parents == list(range(-1, e.drafted - 1)) for e in evs if not e.finished)
            accepted += summ.accepted
        if ix is right:
            assert accepted >= 30  # the replies' own n-grams: most chains accepted
    judged = sum(dec.gate.sources["chain"].cal_n) - sum(DraftGate(None).sources.setdefault("chain", type(dec.gate.sources["chain"])()).cal_n)
    assert judged > 0
    dec.drafters["ngram"].corpus = None  # without a datastore: lookup or the drafter's chain, as before
    dec.reset()
    evs, _ = run_generation(dec, prompts[2], from_spec("hybrid:4"), 40)
    assert [t for e in evs for t in e.emitted] == refs[tuple(prompts[2])]


def test_gate_calibrates_each_kind_apart_and_carries_calibration_to_the_next_conversation():
    from engine.gate import AGREE, MODEL, _bin, raw_probability

    bins = {_bin(0.05), _bin(0.95), _bin(COPIED), _bin(MODEL + 0.05), _bin(MODEL + 0.95), _bin(AGREE + 0.05), _bin(AGREE + 0.999)}
    assert len(bins) == 7 and max(bins) == 30
    assert [raw_probability(x) for x in (0.3, COPIED, MODEL + 0.3, AGREE + 0.3)] == pytest.approx([0.3, 0.9, 0.3, 0.3])
    g = DraftGate(fit({1: 9.0, 2: 9.2, 4: 9.6, 8: 10.4, 16: 12.0}))
    for _ in range(40):  # the drafter's confident tokens are always right, its 0.35s always wrong
        g.observe("tree", depth=2, accepted=1, draft_ms=0.1, drafted=2, confidence=[MODEL + 0.95, MODEL + 0.35])
    assert g.calibrated("tree", MODEL + 0.95) > 0.95 and g.calibrated("tree", MODEL + 0.35) < 0.05
    assert g.calibrated("tree", 0.35) == pytest.approx(0.35) and g.calibrated("tree", AGREE + 0.35) == pytest.approx(0.35)
    g.observe_step(3, 50.0)
    nxt = g.carried()
    assert nxt.calibrated("tree", MODEL + 0.35) == g.calibrated("tree", MODEL + 0.35)
    assert nxt.alpha("tree") == pytest.approx(1 / 3) and g.alpha("tree") > 0.45  # acceptance starts over
    assert nxt.observed == {} and nxt.cost is g.cost
    nxt.observe("tree", depth=1, accepted=1, draft_ms=0.1, drafted=1, confidence=[MODEL + 0.35])
    assert g.sources["tree"].cal_n != nxt.sources["tree"].cal_n  # a copy, not shared


@pytest.mark.parametrize("target_kind, drafter_kind", [("llama", "draft"), ("mamba2", "draft"), ("llama", "mamba2")])
def test_hybrid_auto_mixed_trees_equal_plain_greedy(target_kind, drafter_kind, tmp_path, monkeypatch):
    """hybrid:auto with a datastore: the copy, the datastore and the drafter model (a transformer
    extending a scratch chain, a Mamba-2 stepping a forked state) in one tree, on attention and
    SSM targets: token for token plain greedy, with wrong and right datastores."""
    from engine.gate import MODEL

    dec, prompts, wrong, right, refs = _mixed_setup(target_kind, drafter_kind, tmp_path)
    for ix in (wrong, right):
        dec.drafters["ngram"].corpus = ix
        for prompt in prompts:
            evs, _ = run_generation(dec, prompt, from_spec("hybrid:auto"), 40)
            assert [t for e in evs for t in e.emitted] == refs[tuple(prompt)], prompt
    # on a flat cost every right node pays: mixed trees are drafted, the drafter's nodes among them
    # (the drafter's measured step costs are kept out too: on a loaded machine a tiny model's step
    # can take longer than this flat 1.0 ms verify, and is then rightly left out)
    from engine.drafters.model import Spine

    monkeypatch.setattr(DraftGate, "observe_step", lambda self, rows, ms: None)
    monkeypatch.setattr(DraftGate, "observe_drafter", lambda self, ms: None)
    monkeypatch.setattr(Spine, "ms", property(lambda self: 0.0))
    dec.verify_cost = fit({1: 1.0, 2: 1.0, 4: 1.01, 8: 1.02, 16: 1.04, 32: 1.08})
    dec.drafters["ngram"].corpus = right
    codes = []
    for prompt in prompts:
        dec.reset()
        dec.gate = None  # a new gate on the flat cost
        evs, summ = run_generation(dec, prompt, from_spec("hybrid:auto"), 40)
        assert [t for e in evs for t in e.emitted] == refs[tuple(prompt)], prompt
        assert summ.accepted >= 10, (prompt, summ)
        codes += [(c, p) for e in evs if e.policy for c, p in zip(e.policy.get("confidence", []), e.tree_parents)]
        assert all(e.policy["source"] == "tree" for e in evs if e.policy)
        assert all(e.strategy.startswith("hybrid tree<=16 auto") for e in evs)  # trees, not chains of 3
    # the drafter's proposals below the root: it stepped along the tree's path
    assert any(c >= MODEL and p >= 0 for c, p in codes) and any(0 <= c < MODEL for c, _ in codes)
    dec.drafters["ngram"].corpus = None


def test_shipped_pair_mixes_trees_in_bf16_with_the_drafter_in_fp32(smollm2_gguf_path, tmp_path):
    """The registry's SmolLM2 pairing in bf16: the drafter loads in fp32 on a CPU (its C step and
    Q8_0 products; its numbers never decide what is emitted) and hybrid:auto, with the shipped
    datastore and drafter in one tree, equals plain greedy decoding in bf16."""
    import torch

    from engine.session import ChatSession

    s = ChatSession.load(dtype="bf16", max_context=512)
    assert s.target.model.compute_dtype == torch.bfloat16 and s.drafter.model.dtype == torch.float32
    # the pairing's best measured strategy: pld:auto in q8 and in bf16 (bench/results/2026-11-26-session20)
    assert (s.strategy.name, s.strategy.adaptive) == ("pld", True)
    assert s.registry.default_pairing(s.target.name).strategy_for("q8") == "pld:auto"
    # a pairing's strategy_by_compute picks by the compute type in use
    toml = tmp_path / "models.toml"
    text = s.registry.path.read_text().replace('local = "assets/', f'local = "{s.registry.path.parent}/assets/')
    text = text.replace('datastore = "assets/', f'datastore = "{s.registry.path.parent}/assets/')
    marker = 'drafter = "mamba-drafter-smollm2"\nvocab = "same"\nstrategy = "pld:auto"\n'
    assert marker in text
    toml.write_text(text.replace(marker, marker + 'strategy_by_compute = { bf16 = "hybrid:auto" }\n'))
    s2 = ChatSession.load(dtype="bf16", max_context=512, models_file=str(toml))
    assert (s2.strategy.name, s2.strategy.adaptive) == ("hybrid", True) and s2.decoder.drafters["ngram"].corpus is not None
    assert s2.registry.default_pairing(s2.target.name).strategy_for("q8") == "pld:auto"
    dec = s.decoder
    assert dec.drafters["ngram"].corpus is not None and dec._mixes(dec.drafters["model"])
    ids = s.encode_chat([{"role": "user", "content": "Write a SQL query that counts the orders of each customer."}])
    ref = [t for e in run_generation(dec, ids, preset("ar"), 24)[0] for t in e.emitted]
    evs, summ = run_generation(dec, ids, from_spec("hybrid:auto"), 24)
    assert [t for e in evs for t in e.emitted] == ref
    assert summ.accepted > 0 and all(e.policy["source"] == "tree" for e in evs if e.policy)
    # hybrid:5's chains, ranked by the drafter's shipped chain scorer (engine/chain_scorer.py)
    assert s.drafter.model.chain_scorer is not None
    evs, summ = run_generation(dec, ids, from_spec("hybrid:5"), 24)
    assert [t for e in evs for t in e.emitted] == ref and summ.accepted > 0


def test_gate_takes_the_drafter_model_in_only_where_its_measured_cost_pays():
    from engine.gate import DRAFTER_GAIN, DRAFTER_RECHECK

    slow = DraftGate(fit({1: 30.0, 2: 30.2, 4: 30.5, 8: 31.0, 16: 35.0}))  # a bf16-like step: 30 ms
    assert slow.with_drafter()  # not measured yet: it joins, to be measured
    slow.observe_drafter(3.0)
    assert 3.0 < DRAFTER_GAIN * 30.0 and all(slow.with_drafter() for _ in range(50))
    fast = DraftGate(fit({1: 3.3, 2: 3.6, 4: 4.2, 8: 5.5, 16: 8.0}))  # a q8-like step: 3.3 ms
    fast.observe_drafter(2.0)
    assert fast.with_drafter()  # one measure is not enough to leave it out
    fast.observe_drafter(2.0)
    uses = [fast.with_drafter() for _ in range(7 * DRAFTER_RECHECK)]
    # re-measured after DRAFTER_RECHECK steps, then after twice as many, then four times ...
    assert [i + 1 for i, u in enumerate(uses) if u] == [DRAFTER_RECHECK, 3 * DRAFTER_RECHECK, 7 * DRAFTER_RECHECK]
    nxt = fast.carried()
    assert nxt.drafter_ms == fast.drafter_ms and nxt._recheck == 8 * DRAFTER_RECHECK  # carries over
    nxt.observe_drafter(0.1)  # cheap again (the machine's load fell): it joins, the wait resets
    assert nxt.with_drafter() and nxt._recheck == DRAFTER_RECHECK
    # one slow measure (a first step's set-up, a busy moment) does not keep it out; a lasting rise does
    slow.observe_drafter(40.0)
    assert slow.with_drafter()
    for _ in range(5):
        slow.observe_drafter(40.0)
    assert not slow.with_drafter()


def test_gate_keeps_the_drafter_model_in_only_while_its_measured_tokens_per_ms_beat_going_without():
    """Past the cost rule, the mixed steps' outcomes decide: tokens per ms with the drafter against
    without (its larger verify pass counts too); one step in MIXED_EXPLORE takes the other arm, so
    both stay measured and a change of text or machine can turn the choice back, the wait doubling
    (up to MIXED_EXPLORE_MAX) while exploring leaves the verdict as it was."""
    from engine.gate import MIXED_EXPLORE, MIXED_EXPLORE_MAX, MIXED_MIN

    g = DraftGate(fit({1: 23.0, 2: 23.2, 4: 23.5, 8: 24.0, 16: 30.0}))  # a bf16-like step
    g.observe_drafter(3.0)
    g.observe_drafter(3.0)  # cheap enough by the cost rule
    for _ in range(MIXED_EXPLORE - 1):  # not yet measured with it: it is taken
        assert g.with_drafter()
        g.observe_mixed(True, 2, 30.0)  # 2 tokens in 30 ms with it
    arms = []
    for _ in range(200):
        use = g.with_drafter()
        arms.append(use)
        g.observe_mixed(use, 2 if use else 2, 30.0 if use else 24.0)  # the same tokens, faster without
    settled = arms[(MIXED_MIN + 1) * MIXED_EXPLORE:]
    assert arms.count(False) >= MIXED_MIN
    assert 1 <= settled.count(True) <= len(settled) / MIXED_EXPLORE  # only the exploring steps take it,
    explored = [i for i, a in enumerate(arms) if a and i >= (MIXED_MIN + 1) * MIXED_EXPLORE]
    gaps = [b - a for a, b in zip(explored, explored[1:])]
    assert gaps == sorted(gaps) and gaps[-1] == MIXED_EXPLORE_MAX and gaps[0] < MIXED_EXPLORE_MAX  # less and less often
    # the text changes: now it brings enough tokens to pay for its time
    for _ in range(400):
        use = g.with_drafter()
        arms.append(use)
        g.observe_mixed(use, 4 if use else 2, 30.0 if use else 24.0)
    assert 1 <= arms[-80:].count(False) <= 80 / MIXED_EXPLORE  # in again, exploring going without now and then
    nxt = g.carried()
    assert nxt.arms == g.arms and nxt.arms["tree"] is not g.arms["tree"]  # what it brings carries to the next conversation


def test_hybrid_auto_goes_on_without_a_drafter_whose_context_is_full(tmp_path, monkeypatch):
    """A drafter with a shorter context than the target's: once it is full, mixed trees go on
    from the copy and the datastore alone (plain greedy output, no error)."""
    monkeypatch.setattr(DraftGate, "with_drafter", lambda self: True)  # a tiny drafter never pays: ask anyway
    target = load(str(saved("llama", str(tmp_path)))).model
    dec = Decoder(target, load(str(saved("draft", str(tmp_path))), max_context=24).model)
    prompt = [3, 1, 4, 1, 6]
    ref = [t for e in run_generation(dec, prompt, preset("ar"), 40)[0] for t in e.emitted]
    dec.drafters["ngram"].corpus = _tiny_datastore(dec, [prompt])
    evs, _ = run_generation(dec, prompt, from_spec("hybrid:auto"), 40)
    assert [t for e in evs for t in e.emitted] == ref
    assert any(e.policy and e.policy.get("drafter") is False for e in evs[-5:])
