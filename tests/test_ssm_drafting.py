"""Recurrent drafters (mamba-drafters §4.1, ALGORITHMS.md §4): ``model.fork(n)``, ``batch.step``
and ``batch.fork(parent_rows)`` on Mamba-1, Mamba-2 and Granite-4.0-H, against transformers' full
forward of history + each row's tokens; then ModelDrafter drafting chains and trees with them,
for themselves and for a llama target, in the decode loop (STYLE.md item 6: speculative greedy ==
plain greedy, token for token)."""

from __future__ import annotations

import pytest
import torch

from engine.drafters.base import DraftRequest
from engine.drafters.model import ModelDrafter
from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.strategy import preset

from .accept_util import TeacherForced, WrongAfter, partial_steps
from .test_granite_hybrid import SPECS as GRANITE_SPECS, hf_granite
from .test_mamba import hf_mamba, one_thread  # noqa: F401  (one_thread: the autouse fixture, for this module too)
from .test_mamba2 import hf_mamba2
from .tiny import saved

TOL = 1e-4  # logits, fp32 vs transformers (as the families' own tests)
BUILDERS = {
    "mamba-tied": lambda: hf_mamba("tied"),
    "mamba-untied": lambda: hf_mamba("untied"),  # K = 3, biases, bf16-style residual
    "mamba2-g1": lambda: hf_mamba2("g1"),
    "mamba2-g2": lambda: hf_mamba2("g2"),  # two groups, biases, tied head
    "granite-nope": lambda: hf_granite(GRANITE_SPECS["nope"]),
    "granite-rope": lambda: hf_granite(GRANITE_SPECS["rope"]),  # RoPE: draft rows need the right positions
}
FAMILIES = ["mamba-tied", "mamba2-g1", "granite-nope"]  # one of each for the decode-loop tests
HIST = [(7 * i * i + 3 * i + 1) % 96 for i in range(21)]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """name -> (transformers model, its save_pretrained directory), built on first use."""
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            path = tmp_path_factory.mktemp(name)
            hf = BUILDERS[name]()
            hf.save_pretrained(path)
            cache[name] = (hf, path)
        return cache[name]
    return get


def ours(path):
    m = load(str(path)).model
    m.allocate()
    return m


@torch.no_grad()
def hf_last(hf, ids) -> torch.Tensor:
    return hf(torch.tensor([list(ids)]), use_cache=False).logits[0, -1]


def committed(m) -> list[torch.Tensor]:
    """Copies of every tensor of the committed state (and its length, as a tensor)."""
    c = m.cache
    if hasattr(c, "kv"):  # hybrid: the SSM side and the committed K/V rows
        ts = [c.ssm.conv, c.ssm.ssm, c.kv.k[:, :, :c.length], c.kv.v[:, :, :c.length]]
    elif isinstance(c.conv, list):  # Mamba-1: per-layer lists
        ts = list(c.conv) + list(c.ssm)
    else:
        ts = [c.conv, c.ssm]
    return [torch.tensor(c.length)] + [t.clone() for t in ts]


# ---- fork / step / fork(parent_rows) --------------------------------------------------------------
@pytest.mark.parametrize("name", list(BUILDERS))
def test_fork_step_rows_equal_full_forwards(name, zoo):
    """Depth by depth, every row's logits equal a full forward of history + its root-to-row tokens;
    parent rows are gathered out of order, rows step on past the first K/V-tail allocation, and the
    committed state is left bit for bit as it was."""
    hf, path = zoo(name)
    m = ours(path)
    m.prefill(HIST[:-1])
    root = m.verify(HIST[-1:], [-1])[0]
    m.commit([0])
    before = committed(m)
    probe = m.verify([5], [-1])[0].clone()  # what the committed state predicts, before drafting
    m.cache.clear_scratch()
    paths: list[list[int]] = [[]]  # root-to-row tokens of each row of the current batch
    batch = None
    worst = 0.0
    g = torch.Generator().manual_seed(0)  # fixed: a rare random path is ill-conditioned (gated norm) even for verify vs HF
    plan = [None, [0, 0, 1, 2, 2], [4, 0, 3], [0, 1, 2]] + [[0, 1, 2]] * 8  # 12 steps: tails grow past 8
    for depth, parents in enumerate(plan):
        rows = 3 if parents is None else len(parents)
        toks = torch.randint(0, 96, (rows,), generator=g)
        batch = m.fork(3) if parents is None else batch.fork(torch.tensor(parents))
        paths = [[] for _ in range(3)] if parents is None else [list(paths[p]) for p in parents]
        for r in range(rows):
            paths[r].append(int(toks[r]))
        got = batch.step(toks)
        assert got.shape == (rows, 96) and batch.rows == rows and batch.steps == depth + 1
        if depth < 4 or depth == len(plan) - 1:
            worst = max(worst, max((got[r] - hf_last(hf, HIST + paths[r])).abs().max().item() for r in range(rows)))
    print(f"{name}: fork/step max |dlogit| {worst:.2e} over {len(plan)} depths")
    assert worst <= TOL
    after = committed(m)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert m.cache.scratch == 0 and torch.equal(m.verify([5], [-1])[0], probe)
    assert (root - hf_last(hf, HIST)).abs().max().item() <= TOL


@pytest.mark.parametrize("name", ["mamba-tied", "mamba2-g2", "granite-rope"])
def test_draft_buffers_are_preallocated_once_per_depth_and_size(name, zoo):
    """mamba-drafters §4.1: one state buffer per (depth, B_i), reused by every later draft."""
    _, path = zoo(name)
    m = ours(path)
    m.prefill(HIST)

    def draft():
        b0 = m.fork(3)
        b0.step(torch.tensor([1, 2, 3]))
        b1 = b0.fork(torch.tensor([0, 0, 1, 1, 2, 2]))
        b1.step(torch.arange(6))
        b2 = b1.fork(torch.tensor([5, 4, 3]))  # same B as depth 0: its own buffers, no aliasing
        return [t.data_ptr() for b in (b0, b1, b2) for t in b.state.values()]

    first = draft()
    assert len(set(first)) == len(first)
    assert draft() == first


def test_fork_and_step_check_their_arguments(zoo):
    _, path = zoo("mamba2-g1")
    m = ours(path)
    m.prefill(HIST)
    with pytest.raises(ValueError, match="one token per row"):
        m.fork(2).step(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="at least one row"):
        m.fork(0)
    with pytest.raises(ValueError, match="parent rows"):
        m.fork(2).fork(torch.tensor([[0, 1]]))


# ---- ModelDrafter with recurrent drafters ---------------------------------------------------------------
@pytest.mark.parametrize("name", FAMILIES)
def test_model_drafter_trees_from_forks(name, zoo):
    """Each sibling set is the drafter's top-N at its parent (greedy); no scratch nodes are used;
    sampled trees record q; a diverging history rebuilds the state (prefix_rollback False)."""
    _, path = zoo(name)
    m = ours(path)
    d = ModelDrafter(m, 96)
    ref = ours(path)
    hist = HIST[:12]
    tree = d.propose(hist, DraftRequest(shape=(3, 2, 1)))
    assert len(tree) == 3 + 6 + 6 and m.cache.scratch == 0 and m.cache.length == len(hist)
    for i in range(len(tree)):
        p = tree.parents[i]
        logits = ref.full_logits(hist + (tree.path_tokens(tree.path_to(p)) if p >= 0 else []))[-1]
        sib = tree.children(p)
        assert set(tree.tokens[j] for j in sib) == set(torch.topk(logits, len(sib)).indices.tolist())
    g = torch.Generator().manual_seed(0)
    sampled = d.propose(hist, DraftRequest(shape=(2, 2), mode="sample", temperature=1.0, generator=g))
    assert sampled.sampling == "without_replacement" and len(set(sampled.tokens[:2])) == 2
    for r in range(3):  # root and both depth-1 nodes were expanded
        assert sampled.draft_probs[r].sum().item() == pytest.approx(1.0, abs=1e-5)
    for other in (hist[:-1] + [(hist[-1] + 1) % 96],  # rolls back inside the last commit
                  hist[:5] + [1, 2, 3, 4]):  # diverges further back: rebuilt from 0
        got = d.propose(other, DraftRequest(shape=(3, 2, 1)))
        want = ModelDrafter(ours(path), 96).propose(other, DraftRequest(shape=(3, 2, 1)))
        assert (got.tokens, got.parents) == (want.tokens, want.parents)


def greedy_runs(dec: Decoder, prompt: list[int], n: int, self_drafting: bool) -> list[int]:
    ref, _ = run_generation(dec, prompt, preset("ar"), n)
    want = [t for e in ref for t in e.emitted]
    for s in (preset("sd", draft_len=4), preset("tree", tree=(3, 2, 1))):
        dec.reset()
        evs, _ = run_generation(dec, prompt, s, n)
        assert [t for e in evs for t in e.emitted] == want, s.label()
        if self_drafting:  # a model drafting for itself is always right: the whole depth is accepted
            depth = 4 if s.name == "sd" else 3
            assert all(e.accepted == depth for e in evs[:-1]), (s.label(), [e.accepted for e in evs])
    return want


@pytest.mark.parametrize("name", FAMILIES)
def test_self_drafting_accepts_every_draft_token(name, zoo):
    """A model drafting for itself is accepted whole; with its first-ranked chain made wrong at
    depth k it is accepted for exactly k - 1 tokens, and the next step's draft (the drafter caught
    up on the accepted tokens and the target's correction) is right again."""
    _, path = zoo(name)
    m = ours(path)
    dec = Decoder(m, m)  # the model drafts for itself through its own cache, by fork/step
    assert dec.drafters["model"].recurrent
    prompt = [1, 5, 9, 3, 5, 9, 3, 7, 2, 5, 9]
    want = greedy_runs(dec, prompt, 24, self_drafting=True)
    real = dec.drafters["model"]
    for s in (preset("sd", draft_len=4), preset("tree", tree=(3, 2, 1)), preset("sd", draft_len=4, backtrack="joint")):
        dec.drafters["model"] = wrong = WrongAfter(real, 96, wrong_at=(3, 1, 0, 2, 4))
        dec.reset()
        evs, _ = run_generation(dec, prompt, s, 24)
        assert [t for e in evs for t in e.emitted] == want, s.label()
        got = [(e.accepted, k - 1 if 0 < k <= d else d) for (k, d), e in zip(wrong.log, evs) if not e.finished]
        assert all(a == b for a, b in got), (s.label(), got)
        assert partial_steps(evs) > 0, s.label()
    dec.drafters["model"] = real


@pytest.mark.parametrize("name", FAMILIES)
def test_ssm_drafter_for_a_llama_target(name, zoo, tmp_path_factory):
    """A different model drafting (same 96-token vocabulary): often wrong, never changes the
    output; then told the target's next 0-3 tokens each step (a chain, its own tree drafted
    after them), so that its drafts are accepted in part and rejected below."""
    _, path = zoo(name)
    target = load(str(saved("llama", str(tmp_path_factory.getbasetemp())))).model
    dec = Decoder(target, ours(path))
    prompt = [1, 5, 9, 3, 5, 9, 3, 7, 2, 5, 9]
    want = greedy_runs(dec, prompt, 24, self_drafting=False)
    assert len(want) == 24
    real = dec.drafters["model"]
    for s in (preset("sd", draft_len=4), preset("tree", tree=(3, 2, 1))):
        dec.drafters["model"] = forced = TeacherForced(real, prompt + want, good=(2, 1, 3, 0, 2))
        dec.reset()
        evs, _ = run_generation(dec, prompt, s, 24)
        assert [t for e in evs for t in e.emitted] == want, s.label()
        got = [(e.accepted, n) for n, e in zip(forced.log, evs) if not e.finished]
        assert all(a >= n for a, n in got), (s.label(), got)
        assert partial_steps(evs) > 0, s.label()
    dec.drafters["model"] = real
