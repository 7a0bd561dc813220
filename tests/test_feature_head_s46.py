"""Feature drafter (engine/drafters/feature.py): the decoder keeps it fed with the target's hidden
rows of exactly the committed positions; its chains and trees are what the head computes without a
cache; every strategy drafting with it emits plain greedy decoding's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.drafters.base import DraftRequest
from engine.feature_head import FeatureHead, load_head
from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.strategy import from_spec as parse_strategy
from tests.tiny import saved


def _head(D: int = 64, V: int = 96, seed: int = 0, vocab=None) -> FeatureHead:
    torch.manual_seed(seed)
    h = FeatureHead(D, 4, 16, 96, torch.arange(V) if vocab is None else vocab)
    with torch.no_grad():
        for p in h.parameters():
            if p.dim() == 2:
                p.mul_(4.0)  # sharper than init: drafts that are not all ties
    return h.eval()


def _decoder(tmp_path, kind="llama_tied", head=None):
    target = load(str(saved(kind, str(tmp_path)))).model
    dec = Decoder(target)
    dec.attach_feature_head(head if head is not None else _head())
    return dec


def _hidden(model, ids):
    """The target's final-norm hidden rows over ids, from an empty cache."""
    m = model.with_own_cache()
    m.allocate(len(ids) + 8)
    with m.logging_hidden() as log:
        m.verify(ids, list(range(-1, len(ids) - 1)))
    return log[0]


PROMPT = [5, 17, 3, 44, 9, 12, 5, 17, 3, 60, 2, 8]


@pytest.mark.parametrize("spec", ["sd:5", "tree:2,2,1", "sd:auto", "hybrid:4", "pld:auto"])
def test_greedy_identical_and_features_aligned(tmp_path, spec):
    dec = _decoder(tmp_path)
    evs, _ = run_generation(dec, PROMPT, parse_strategy("ar"), 40)
    want = [t for e in evs for t in e.emitted]
    evs, _ = run_generation(dec, PROMPT, parse_strategy(spec), 40)
    got = [t for e in evs for t in e.emitted]
    assert got == want
    fd = dec.features
    n = dec.target.cache.length
    assert fd.n_feat == n == len(dec.history) - 1
    ref = _hidden(dec.target, dec.history[:n])
    torch.testing.assert_close(fd.features[:n].float(), ref.float(), atol=0.05, rtol=0.05)
    if spec in ("sd:5", "tree:2,2,1"):
        assert sum(e.drafted for e in evs) > 0  # it drafted


def test_multi_turn_prefix_reuse_keeps_features_aligned(tmp_path):
    dec = _decoder(tmp_path)
    run_generation(dec, PROMPT, parse_strategy("sd:4"), 20)
    second = dec.history[:-3] + [7, 7, 31]  # shares a prefix with the cache, then differs
    evs, _ = run_generation(dec, second, parse_strategy("sd:4"), 20)
    n = dec.target.cache.length
    assert dec.features.n_feat == n
    torch.testing.assert_close(dec.features.features[:n].float(), _hidden(dec.target, dec.history[:n]).float(), atol=0.05, rtol=0.05)
    fresh = _decoder(tmp_path)
    evs2, _ = run_generation(fresh, second, parse_strategy("ar"), 20)
    assert [t for e in evs for t in e.emitted] == [t for e in evs2 for t in e.emitted]


def _reference_paths(head, feats, history, shape):
    """Every root-to-leaf path by recomputing the head over the whole sequence, no cache."""
    L = len(history)
    ids = torch.tensor(history[1:L])
    base_x = head.inputs(ids[None], feats[:L - 1][None])
    paths = [([], base_x, None)]
    out = []
    for d, width in enumerate(shape):
        nxt = []
        for toks, x, _ in paths:
            f, _ = head.layer(x, torch.arange(x.shape[1]))
            top = head.logits(f[0, -1]).float().topk(width).indices
            for i in top.tolist():
                t = int(head.vocab_ids[i])
                xi = head.inputs(torch.tensor([[t]]), f[:, -1:])
                nxt.append((toks + [t], torch.cat([x, xi], 1), None))
        paths = nxt
    return sorted(p for p, _, _ in paths)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 2), (3, 1, 2)])
@pytest.mark.parametrize("path", ["native", "torch"])
def test_drafts_match_uncached_head(tmp_path, shape, path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_DRAFT_Q8", "0")  # the head's own fp32 products (Q8_0 rounds them: other drafts at near-ties)
    dec = _decoder(tmp_path)
    native = dec.features.model._native_table() is not None
    if path == "torch":  # no C pass (no compiler, another device): the layer in torch, the same drafts
        dec.features.model.__dict__["_native_tab"] = None
    elif not native:
        pytest.skip("the C pass is not built here")
    run_generation(dec, PROMPT, parse_strategy("ar"), 6)  # features for a context
    fd = dec.features
    hist = list(dec.history)
    with torch.inference_mode():
        tree = fd.propose(hist, DraftRequest(shape=shape))
        leaves = [i for i in range(len(tree)) if i not in set(tree.parents)]
        got = []
        for leaf in leaves:
            path, i = [], leaf
            while i >= 0:
                path.append(tree.tokens[i]); i = tree.parents[i]
            got.append(path[::-1])
        want = _reference_paths(fd.head, fd.features, hist, shape)
    assert sorted(got) == want
    # asked again after more context: the cached rows are reused and still agree
    run_generation(dec, hist + [4, 4], parse_strategy("ar"), 3)
    with torch.inference_mode():
        tree = fd.propose(list(dec.history), DraftRequest(shape=(1, 1, 1)))
        want = _reference_paths(fd.head, fd.features, list(dec.history), (1, 1, 1))
    assert [tree.tokens] == want


def test_save_load_round_trip(tmp_path):
    h = _head(vocab=torch.tensor([1, 5, 9, 30, 95]))
    h.save(tmp_path / "head")
    g = load_head(tmp_path / "head")
    assert g.vocab_ids.tolist() == [1, 5, 9, 30, 95]
    for (n, a), (_, b) in zip(sorted(h.state_dict().items()), sorted(g.state_dict().items())):
        torch.testing.assert_close(a.to(torch.bfloat16).float(), b.float(), msg=n)


def test_non_transformer_target_refused(tmp_path):
    from engine.errors import SpecchatError

    dec = Decoder(load(str(saved("mamba2", str(tmp_path)))).model)
    with pytest.raises(SpecchatError, match="Transformer"):
        dec.attach_feature_head(_head())


# ---- through the chat session (`--drafter DIR` holding a feature head) ----------------------------
def _session_models(tmp_path):
    from tests.test_session_review_s41 import _tiny

    target = _tiny(tmp_path, "target", 0)
    torch.manual_seed(3)
    h = FeatureHead(32, 2, 16, 64, torch.arange(260))
    with torch.no_grad():
        for p in h.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    h.save(tmp_path / "head", meta={"target": "tiny"})
    return str(target), str(tmp_path / "head")


def _reply(session, convo, n=30, strategy=None):
    import threading

    if strategy is not None:
        session.strategy = parse_strategy(strategy)
    return [t for ev in session.stream_chat(convo, n, threading.Event()) for t in ev.emitted]


def test_session_loads_head_directory_and_replies_as_plain_decoding(tmp_path):
    from engine.session import ChatSession

    target, head = _session_models(tmp_path)
    s = ChatSession.load(target=target, drafter=head, dtype="fp32", max_context=400, strategy="sd:4")
    assert s.has_drafter and s.decoder.features is not None
    plain = ChatSession.load(target=target, drafter="none", dtype="fp32", max_context=400, strategy="ar")
    convo = [{"role": "user", "content": "hello there, hello there"}]
    a = _reply(s, convo)
    assert a == _reply(plain, convo)
    convo += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and again, hello there"}]
    for spec in ("sd:4", "tree:2,2", "hybrid:auto"):
        assert _reply(s, convo, strategy=spec) == _reply(plain, convo), spec


@pytest.mark.parametrize("damage", ["truncate", "wide", "vocab"])
def test_bad_head_is_one_line(tmp_path, damage):
    from engine.errors import SpecchatError
    from engine.session import ChatSession

    target, head = _session_models(tmp_path)
    hp = Path(head)
    if damage == "truncate":
        (hp / "model.safetensors").write_bytes((hp / "model.safetensors").read_bytes()[:100])
    elif damage == "wide":
        FeatureHead(64, 4, 16, 64, torch.arange(10)).save(hp)
    else:
        FeatureHead(32, 2, 16, 64, torch.tensor([1, 2, 999])).save(hp)
    with pytest.raises(SpecchatError) as e:
        ChatSession.load(target=target, drafter=head, dtype="fp32", max_context=400, strategy="sd:4")
    msg = str(e.value)
    assert "\n" not in msg and "head" in msg


def test_spine_follows_the_uncached_head(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_DRAFT_Q8", "0")
    dec = _decoder(tmp_path)
    run_generation(dec, PROMPT, parse_strategy("ar"), 6)
    fd, hist = dec.features, list(dec.history)
    sp = fd.spine(hist, k=2)
    path = []
    for _ in range(4):
        t = sp.candidates()[0][0]
        path.append(t)
        sp.advance(t)
    with torch.inference_mode():
        assert [path] == _reference_paths(fd.head, fd.features, hist, (1, 1, 1, 1))
    assert sp.steps == 4 and sp.spent_ms > 0


@pytest.mark.parametrize("spec", ["hybrid:auto", "hybrid:4", "pld:auto"])
def test_with_a_datastore_identical(tmp_path, spec):
    """hybrid's best-first tree and mixed chain grow from the head's spine beside the datastore."""
    from engine.drafters.corpus import CorpusIndex

    dec = _decoder(tmp_path)
    evs, _ = run_generation(dec, PROMPT, parse_strategy("ar"), 40)
    want = [t for e in evs for t in e.emitted]
    dec.drafters["ngram"].corpus = CorpusIndex.build([(PROMPT + want[:20], 0)] * 2 + [([5, 17, 3, 9, 9, 9], 0)], n_max=3, min_count=1)
    assert dec._mixes(dec.drafters["model"])
    evs, _ = run_generation(dec, PROMPT, parse_strategy(spec), 40)
    assert [t for e in evs for t in e.emitted] == want
    assert sum(e.drafted for e in evs) > 0
    # steps that accepted several tokens at once (the datastore's copies) kept the features aligned
    assert max(e.accepted for e in evs) >= 2
    n = dec.target.cache.length
    assert dec.features.n_feat == n
    torch.testing.assert_close(dec.features.features[:n].float(), _hidden(dec.target, dec.history[:n]).float(), atol=0.05, rtol=0.05)


# ---- `specchat distill head` ------------------------------------------------------------------------
def _replies(d: Path, n: int, seed: int = 0) -> Path:
    import json
    import random

    d.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    with open(d / "responses.jsonl", "w") as f:
        for i in range(n):
            prompt = [rng.randrange(96) for _ in range(rng.randrange(3, 8))]
            reply = [(prompt[-1] + 3 * j) % 96 for j in range(rng.randrange(8, 20))]  # a pattern to learn
            f.write(json.dumps({"id": f"r{i}", "kind": "t", "prompt_ids": prompt, "response_ids": reply}) + "\n")
        f.write('{"id": "cut", "prompt_ids": [1, 2')  # a line cut by a kill: skipped
    return d


def test_distill_head_trains_saves_and_resumes(tmp_path, capsys):
    import json

    from engine import cli

    target = str(saved("llama_tied", str(tmp_path)))
    data = _replies(tmp_path / "data", 40)
    out = tmp_path / "head"
    args = ["distill", "head", "--target", target, "--data", str(data), "--out", str(out), "--replies", "30",
            "--minutes", "0.05", "--vocab", "50", "--inter", "32", "--save-every", "3", "--batch-tokens", "256"]
    assert cli.main(args) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["chain5_tokens_per_step"] >= 1.0 and len(report["accepted_by_depth"]) == 5
    shards = sorted(p.relative_to(out / "features").as_posix() for p in (out / "features").glob("*/shard*"))
    assert shards == [f"{tmp_path.name}-data/shard0000.safetensors"]
    h = load_head(out)
    assert len(h.vocab_ids) == 50 and h.cfg["inter"] == 32
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "specchat_feature_head" and cfg["distill"]["steps"] >= 1
    # the head drafts for the target through the session (`--drafter DIR`), emitting plain decoding's tokens
    dec = Decoder(load(target).model)
    dec.attach_feature_head(h)
    plain, _ = run_generation(Decoder(load(target).model), [5, 8, 11], parse_strategy("ar"), 30)
    got, _ = run_generation(dec, [5, 8, 11], parse_strategy("sd:4"), 30)
    assert [t for e in got for t in e.emitted] == [t for e in plain for t in e.emitted]
    # a rerun reuses the features and goes on from the head
    shard = out / "features" / shards[0]
    mtime = shard.stat().st_mtime_ns
    assert cli.main(args + ["--init", str(out)]) == 0
    assert shard.stat().st_mtime_ns == mtime
    # more replies: the shard cut short is redone with them (the same features for its first 30)
    from engine.distill_head import _load_dir

    before = _load_dir(shard.parent)
    assert cli.main([a if a != "30" else "40" for a in args]) == 0
    after = _load_dir(shard.parent)
    assert len(before) == 30 and len(after) == 40
    assert all(torch.equal(a["feat"], b["feat"]) for a, b in zip(before, after))
    # features of another max length in the same place: one line, nothing overwritten
    capsys.readouterr()
    mtime = shard.stat().st_mtime_ns
    assert cli.main(args + ["--max-len", "64"]) != 0
    assert "holds features of other replies" in capsys.readouterr().err
    assert shard.stat().st_mtime_ns == mtime


def test_distill_head_refusals(tmp_path, capsys):
    from engine import cli

    target = str(saved("llama_tied", str(tmp_path)))
    data = _replies(tmp_path / "data", 5)
    base = ["distill", "head", "--target", target, "--data", str(data), "--out", str(tmp_path / "h")]
    assert cli.main(base + ["--minutes", "nan"]) != 0
    assert cli.main(base[:5] + [str(tmp_path / "nowhere"), "--out", str(tmp_path / "h2")]) != 0
    ssm = str(saved("mamba2", str(tmp_path)))
    assert cli.main(["distill", "head", "--target", ssm, "--data", str(data), "--out", str(tmp_path / "h3")]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--minutes" in err and "not a `distill data` directory" in err and "Transformer" in err


def test_unrolled_training_pass_is_what_drafting_computes():
    """distill head's pass u at row p = the depth-(u+1) node of the chain begun at the true row
    p - u, computed incrementally as the drafter does (true rows before it, the chain, itself)."""
    torch.manual_seed(0)
    emb = torch.randn(96, 64)
    h = _head().attach(emb, emb)
    T = 12
    ids, feat = torch.randint(0, 96, (1, T + 1)), torch.randn(1, T + 1, 64)
    pos = torch.arange(T)
    with torch.no_grad():
        f, (k, v) = h.layer(h.inputs(ids[:, 1:], feat[:, :-1]), pos)
        keys, values, outs = [k], [v], [f]
        for _ in range(2):
            fin = torch.cat([feat[:, :1], outs[-1][:, :-1]], 1)
            f, (k, v) = h.layer_unrolled(h.inputs(ids[:, 1:], fin), pos, keys, values)
            keys.append(k); values.append(v); outs.append(f)
        for p in range(2, T):
            r = p - 2
            past = (keys[0][:, :, :r], values[0][:, :, :r])
            x = h.inputs(ids[:, r + 1:r + 2], feat[:, r:r + 1])
            for d in range(3):
                fd_, (k1, v1) = h.layer(x, torch.tensor([r + d]), past=past if past[0].shape[2] else None,
                                        mask=None if past[0].shape[2] else torch.ones(1, 1, dtype=torch.bool))
                past = (torch.cat([past[0], k1], 2), torch.cat([past[1], v1], 2))
                torch.testing.assert_close(fd_[0, 0], outs[d][0, r + d], atol=1e-4, rtol=1e-4)
                if d < 2:
                    x = h.inputs(ids[:, r + d + 2:r + d + 3], fd_)


def test_bench_json_with_a_head(tmp_path, capsys):
    import json

    from engine import cli

    target, head = _session_models(tmp_path)
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"name": "a", "text": "hello there, hello there"}, {"name": "b", "text": "abcabcabc"}]))
    assert cli.main(["bench", "--target", target, "--drafter", head, "--dtype", "fp32", "--strategies", "ar,sd:4,tree:2-2,hybrid:auto",
                     "--max-new-tokens", "16", "--prompts", str(prompts), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = [r for r in out["rows"] if r["prompt"] in ("a", "b")]
    assert len(rows) == 8 and all(r["identical_to_ar"] for r in rows)
    assert out["settings"]["drafter"]["description"] == "head (feature-head, float32)"
