"""Drafters: n-gram lookup branches, and the model drafter's cache staying in step with the
conversation (reusing accepted draft K/V) while producing trees of the requested shape."""

from __future__ import annotations

import pytest
import torch

from engine.drafters.base import DraftRequest
from engine.drafters.model import ModelDrafter
from engine.drafters.ngram import NgramDrafter
from engine.loading import load
from engine.tree import shape_size

from .tiny import saved


def test_ngram_finds_most_recent_longest_match():
    d = NgramDrafter()
    hist = [1, 2, 3, 9, 9, 1, 2, 3, 7, 7, 5, 1, 2, 3]
    tree = d.propose(hist, DraftRequest(shape=(1, 1, 1)))
    assert tree.tokens == [7, 7, 5] and tree.parents == [-1, 0, 1]  # the most recent "1 2 3" continues "7 7 5"


def test_ngram_several_matches_make_branches_merged_as_a_trie():
    d = NgramDrafter()
    hist = [1, 2, 8, 4, 0, 1, 2, 8, 5, 0, 1, 2, 9, 9, 0, 1, 2]
    tree = d.propose(hist, DraftRequest(shape=(3, 1, 1)))
    conts = {tuple(tree.path_tokens(tree.path_to(i))) for i in range(len(tree)) if not tree.children(i)}
    assert conts == {(9, 9, 0), (8, 5, 0), (8, 4, 0)}
    assert tree.tokens.count(8) == 1  # the shared first token "8" is one node with two children
    assert tree.sampling == "deterministic" and tree.draft_probs is None


def test_ngram_min_and_no_match():
    d = NgramDrafter()
    hist = [5, 6, 7, 1, 2, 3, 6]  # only a 1-token match ("6")
    assert len(d.propose(hist, DraftRequest(shape=(1, 1), ngram_min=2))) == 0
    assert d.propose(hist, DraftRequest(shape=(1, 1), ngram_min=1)).tokens == [7, 1]
    assert len(d.propose([1, 2, 3], DraftRequest(shape=(1,)))) == 0


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny"))


def _scan_continuations(history, k, branches, ngram_min, ngram_max):
    """The definition: for n from the longest down, every earlier occurrence of the last n tokens,
    most recent first, proposes what followed it; distinct continuations, up to ``branches``."""
    L = len(history)
    found: list[list[int]] = []
    for n in range(min(ngram_max, L - 1), max(1, ngram_min) - 1, -1):
        for i in range(L - 1 - n, -1, -1):
            if history[i:i + n] == history[L - n:]:
                cont = history[i + n:i + n + k]
                if cont and cont not in found:
                    found.append(cont)
                    if len(found) >= branches:
                        return found
    return found


def test_ngram_continuations_equal_the_scan_of_every_length():
    """NgramDrafter.continuations finds each match end once at its longest match (one pass over the
    history, not one per n): the same continuations in the same order as the plain scan, on random
    histories over small vocabularies (many repeats, ties, short histories, ngram_min > ngram_max)."""
    import random

    rnd = random.Random(0)
    d = NgramDrafter()
    for _ in range(3000):
        h = [rnd.randrange(rnd.choice([2, 3, 5, 20])) for _ in range(rnd.randint(1, 50))]
        args = (rnd.randint(1, 8), rnd.randint(1, 4), rnd.randint(1, 3), rnd.randint(1, 7))
        assert d.continuations(h, *args) == _scan_continuations(h, *args), (h, args)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 2, 2, 1, 1), (2, 2, 2)])
def test_model_drafter_tree_shapes_and_greedy_children(shape, tiny_root):
    m = load(str(saved("llama", tiny_root))).model
    d = ModelDrafter(m, m.vocab_size)
    hist = [3, 1, 4, 1, 5, 9, 2, 6]
    tree = d.propose(hist, DraftRequest(shape=shape))
    assert len(tree) == shape_size(shape)
    ref = m.with_own_cache()
    for i in range(len(tree)):  # each child set is the top-N of the drafter at its parent
        parent_path = tree.path_tokens(tree.path_to(tree.parents[i])) if tree.parents[i] >= 0 else []
        logits = ref.full_logits(hist + parent_path)[-1]
        siblings = [j for j in range(len(tree)) if tree.parents[j] == tree.parents[i]]
        assert set(tree.tokens[j] for j in siblings) == set(torch.topk(logits, len(siblings)).indices.tolist())


def test_model_drafter_sampled_tree_records_q(tiny_root):
    m = load(str(saved("llama", tiny_root))).model
    d = ModelDrafter(m, m.vocab_size)
    g = torch.Generator().manual_seed(0)
    tree = d.propose([1, 2, 3], DraftRequest(shape=(2, 2), mode="sample", temperature=1.0, generator=g))
    assert tree.sampling == "without_replacement" and tree.draft_probs.shape == (len(tree) + 1, m.vocab_size)
    assert len(set(tree.tokens[:2])) == 2  # siblings drawn without replacement
    for r in range(3):  # root and both depth-1 nodes were expanded: their rows are distributions
        assert tree.draft_probs[r].sum().item() == pytest.approx(1.0, abs=1e-5)


def test_model_drafter_keeps_in_step_and_reuses_accepted_kv(tiny_root):
    m = load(str(saved("llama", tiny_root))).model
    d = ModelDrafter(m, m.vocab_size)
    hist = [7, 8, 9, 10]
    tree = d.propose(hist, DraftRequest(shape=(1, 1, 1, 1)))
    # the target accepted the first two drafts and emitted its own token 5
    new_hist = hist + tree.tokens[:2] + [5]
    tree2 = d.propose(new_hist, DraftRequest(shape=(1, 1)))
    assert d.model.cache.length == len(new_hist) and d.seen == new_hist
    ref = m.with_own_cache().full_logits(new_hist)[-1]
    assert tree2.tokens[0] == int(ref.argmax())
    # a different conversation (regenerate / new chat): the drafter rolls back to the common prefix
    other = [7, 8, 1, 1, 1]
    tree3 = d.propose(other, DraftRequest(shape=(1,)))
    assert d.seen == other and tree3.tokens[0] == int(m.with_own_cache().full_logits(other)[-1].argmax())


def test_draft_vocabulary_shrinks_the_head_and_stays_lossless(tmp_path_factory):
    """A drafter directory with draft_vocab.json proposes only those tokens (its output layer is
    sliced to them): every proposal is the argmax of the drafter's full logits restricted to the
    kept columns (then the runners-up, for trees), and every strategy stays identical to plain
    greedy. The drafter is the target itself: its drafts are accepted wherever the target's
    token is kept, and rejected at the first that is not (partial acceptance)."""
    import json
    import shutil

    import pytest

    from engine.errors import ModelLoadError
    from engine.generate import Decoder, run_generation
    from engine.loading import load
    from engine.strategy import preset
    from tests.accept_util import assert_greedy_children, flat_cost, partial_steps
    from tests.tiny import hf_greedy, saved

    root = str(tmp_path_factory.mktemp("dv"))
    target_path = saved("llama", root)
    dpath = tmp_path_factory.mktemp("dv2") / "draft"
    shutil.copytree(target_path, dpath)
    keep = list(range(0, 96, 2)) + [95]
    (dpath / "draft_vocab.json").write_text(json.dumps({"token_ids": keep}))
    drafter = load(str(dpath)).model
    assert drafter.draft_vocab.tolist() == keep
    target = load(str(target_path)).model
    dec = Decoder(target, drafter)
    dec.verify_cost = flat_cost()  # optimal's tree size from acceptance alone, not this machine's load
    md = dec.drafters["model"]
    assert md.model.lm_head_t.shape[1] == len(keep) and drafter.lm_head_t.shape[1] == 96  # the loaded model is untouched
    full = drafter.with_own_cache()  # the drafter's full logits (all 96 columns)
    prompt = [5, 6, 7, 8]
    ref = hf_greedy(target_path, prompt, 30)
    assert 0 < sum(t in keep for t in ref) < len(ref)  # some of the target's tokens can be drafted, some not
    for s in (preset("sd", draft_len=4), preset("tree"), preset("mab"), preset("optimal")):
        evs, _ = run_generation(dec, prompt, s, 30)
        assert [t for e in evs for t in e.emitted] == ref, s.label()
        assert all(t in set(keep) for e in evs for t in e.tree_tokens)
        assert assert_greedy_children(prompt, evs, full.full_logits, keep) >= len(evs)
        steps = [(e.accepted, e.drafted) for e in evs]
        assert sum(e.accepted for e in evs) >= 5 and partial_steps(evs) > 0, (s.label(), steps)  # 11 accepted measured
    for bad in ('{"token_ids": [1, 1]}', '{"token_ids": [500]}', '{"ids": []}', "not json"):
        (dpath / "draft_vocab.json").write_text(bad)
        with pytest.raises(ModelLoadError, match="draft_vocab.json"):
            load(str(dpath))


def test_row_reduced_drafter_is_lossless_and_drafts_as_the_full_one(tmp_path_factory):
    """A Mamba-2 drafter exported with `distill export --shrink-vocab` (embedding and head rows
    only for the tokens its data holds, one row shared by the rest) drafts exactly the trees the
    full drafter drafts while the conversation stays within the stored tokens: each proposal the
    argmax of the full model's logits over the draft vocabulary (then the runners-up). Drafting
    for the full model itself, it is accepted wherever the target's token is in its draft
    vocabulary and rejected at the first that is not, and every strategy stays identical to
    plain greedy whatever the prompt holds."""
    import json
    import shutil

    from engine.cli import main
    from engine.generate import Decoder, run_generation
    from engine.loading import load
    from engine.strategy import from_spec, preset
    from tests.accept_util import assert_greedy_children, flat_cost, histories, partial_steps
    from tests.tiny import saved

    root = str(tmp_path_factory.mktemp("rows"))
    src = tmp_path_factory.mktemp("rows2") / "draft"
    shutil.copytree(saved("mamba2", root), src)
    keep = list(range(0, 96, 3))
    (src / "draft_vocab.json").write_text(json.dumps({"token_ids": keep}))
    data = tmp_path_factory.mktemp("rows3")
    stored = sorted(set(keep) | set(range(20, 90)))
    with open(data / "responses.jsonl", "w") as f:
        for i in range(2):  # tokens 20..89 twice: stored beside the draft vocabulary
            f.write(json.dumps({"id": i, "prompt_ids": list(range(20, 55)), "response_ids": list(range(55, 90))}) + "\n")
    cut_path = tmp_path_factory.mktemp("rows4") / "cut"
    assert main(["distill", "export", "--from", str(src), "--to", str(cut_path), "--dtype", "fp32", "--shrink-vocab", str(data)]) == 0
    rows = json.loads((cut_path / "draft_vocab.json").read_text())["row_ids"]
    specials = {json.loads((src / "config.json").read_text()).get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    assert set(rows) - {-1} == set(stored) | (specials - {None}) and rows.count(-1) == 1
    full_model = load(str(src)).model  # its own logits: all 96 columns (the loaded model keeps its head)
    logits_of = full_model.with_own_cache().full_logits
    full = Decoder(load(str(src)).model, load(str(src)).model)  # each decoder its own target cache
    cut = Decoder(load(str(src)).model, load(str(cut_path)).model)
    full.verify_cost = cut.verify_cost = flat_cost()  # mab's shapes from acceptance, less from this machine's load
    inside = [42, 45, 51, 60]  # every token stored
    n = 24
    accepted = partial = 0
    for prompt in (inside, [5, 7, 11, 13]):
        ref = [t for e in run_generation(Decoder(full_model), prompt, preset("ar"), n)[0] for t in e.emitted]
        for spec in ("sd:4", "tree:3-2-1", "mab"):  # a fresh strategy per run (mab's bandit keeps its statistics)
            s = from_spec(spec)
            evs, _ = run_generation(cut, prompt, s, n)
            assert [t for e in evs for t in e.emitted] == ref, (prompt, s)
            assert all(t in set(keep) for e in evs for t in e.tree_tokens)
            accepted += sum(e.accepted for e in evs)
            partial += partial_steps(evs)
            # while all seen so far is stored, the cut drafter's proposals are the full model's
            within = [e for h, e in zip(histories(prompt, evs), evs) if set(h) <= set(stored)]  # a leading run
            assert_greedy_children(prompt, within, logits_of, keep)
            if prompt is inside:
                assert len(within) >= 2, (s, len(within))
                if spec != "mab":  # the same trees as the full drafter's (mab's arms follow measured times)
                    evf, _ = run_generation(full, prompt, from_spec(spec), n)
                    for a, b in zip(within, evf):
                        assert a.tree_tokens == b.tree_tokens
    assert accepted >= 6 and partial >= 3, (accepted, partial)  # 10 and 9 measured


def test_shipped_drafter_is_accepted_by_the_default_target(smollm2_gguf_path):
    """The shipped pairing (assets/mamba-drafter-smollm2, a draft vocabulary of 8,192 columns, for
    SmolLM2-135M-Instruct): its chains are accepted in part (12 tokens of 64 measured in fp32; a
    column-to-token mapping off by one accepted none), each drafted token is the argmax of the
    drafter's full logits over its draft vocabulary, and sd stays plain greedy."""
    from engine.generate import run_generation
    from engine.session import ChatSession
    from engine.strategy import preset
    from tests.accept_util import histories

    s = ChatSession.load(max_context=512, dtype="fp32")
    dec = s.decoder
    md = dec.drafters["model"]
    assert md.draft_vocab is not None and len(md.draft_vocab) == 8192
    full = s.drafter.model.with_own_cache()  # the loaded drafter keeps every column of its head
    accepted = 0
    for q in ("Write a SQL query that counts the orders of each customer.", "List three primary colors."):
        ids = s.encode_chat([{"role": "user", "content": q}])
        ref = [t for e in run_generation(dec, ids, preset("ar"), 32)[0] for t in e.emitted]
        evs, summ = run_generation(dec, ids, preset("sd", draft_len=4), 32)
        assert [t for e in evs for t in e.emitted] == ref, q
        accepted += summ.accepted
        for hist, e in list(zip(histories(ids, evs), evs))[:3]:
            for j, tok in enumerate(e.tree_tokens):  # a chain: token j after the first j
                logits = full.full_logits(hist + e.tree_tokens[:j])[-1].float()
                assert float(logits[md.draft_vocab].max() - logits[tok]) <= 1e-3, (q, e.step, j)
    assert accepted >= 6, accepted
