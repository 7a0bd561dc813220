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
    np.savez(tmp_path / "pickle.npz", keys=np.array([{}], dtype=object), tokens=np.arange(1), shares=np.ones(1),
             meta=np.frombuffer(b"{}", dtype=np.uint8))  # an object array would need pickle: refused
    with pytest.raises(SpecchatError, match="not an n-gram datastore"):
        CorpusIndex.load(tmp_path / "pickle.npz")


def test_chains_copy_the_context_then_continue_from_the_datastore():
    ix = CorpusIndex.build([([7, 8, 9, 10, 11, 12], 0)] * 3, n_max=3, min_count=1)
    d = NgramDrafter(corpus=ix)
    # the context's [7, 8] occurred before: prompt lookup copies what followed (1, 7, 8), then the
    # datastore goes on from [7, 8]
    tree = d.corpus_chain([7, 8, 1, 7, 8], k=5)
    assert tree.tokens == [1, 7, 8, 9, 10] and tree.parents == [-1, 0, 1, 2, 3]
    assert tree.confidence[:3] == [COPIED] * 3 and tree.confidence[3:] == [pytest.approx(3 / 4)] * 2
    # no match in the context: all from the datastore, stopping where the shares' product is small
    tree = d.corpus_chain([1, 7], k=20)
    assert tree.tokens[:3] == [8, 9, 10] and len(tree) == 5 and all(c > 0 for c in tree.confidence)  # 12 ends it
    assert d.corpus_chain([1, 2], k=5).tokens == []  # nothing known
    # propose takes this path only for a confidence chain asking for the datastore
    req = DraftRequest(shape=(1,) * 4, confidence=True, corpus=True)
    assert d.propose([1, 7], req).tokens == [8, 9, 10, 11]
    assert d.propose([1, 7], DraftRequest(shape=(1,) * 4)).tokens == []  # plain prompt lookup
    # the gate calibrates copied tokens in a bin of their own
    g = DraftGate(fit({1: 9.0, 2: 10.0, 4: 12.0, 8: 26.0}))
    for _ in range(30):
        g.observe("ngram", depth=2, accepted=2, draft_ms=0.1, drafted=2, confidence=[COPIED, COPIED])
    assert g.calibrated("ngram", COPIED) > 0.9 and g.calibrated("ngram", 0.95) == pytest.approx(0.95)


def _tiny_datastore(dec, prompts, n=40):
    """A datastore of the tiny target's own greedy replies (what `distill ngram` indexes)."""
    seqs = []
    for p in prompts:
        evs, _ = run_generation(dec, p, preset("ar"), n)
        seqs.append((list(p) + [t for e in evs for t in e.emitted], len(p)))
    return CorpusIndex.build(seqs, n_max=4, min_count=1)


def test_pld_auto_with_a_datastore_equals_plain_greedy(tmp_path):
    target = load(str(saved("llama", str(tmp_path)))).model
    dec = Decoder(target)
    train = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3], [5, 8, 9, 7, 9], [3, 2, 3, 8, 4], [6, 2, 6, 4, 3]]
    ix = _tiny_datastore(dec, train)
    cut = False
    for prompt in ([3, 1, 4, 1, 6], [9, 2, 6, 5, 3, 5], list(range(10, 30))):
        ref = [t for e in run_generation(dec, prompt, preset("ar"), 40)[0] for t in e.emitted]
        dec.drafters["ngram"].corpus = ix
        evs, summ = run_generation(dec, prompt, from_spec("pld:auto"), 40)
        assert [t for e in evs for t in e.emitted] == ref, prompt
        dec.drafters["ngram"].corpus = None
        cut = cut or any(e.policy and e.policy.get("confidence") and e.accepted for e in evs)
    assert cut  # the datastore drafted, the gate cut by confidence (its record is on the events), drafts were accepted


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
