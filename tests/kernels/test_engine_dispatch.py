"""The engine's dispatch to the Triton ops (kernels.use_triton) against its PyTorch path, on tiny
Mamba-2 and Granite-4.0-H models: verify of trees and chains (tree conv, tree scan, fused
multi-step update), commit (fused replay), drafting (in-place one-token update, state gather on
fork), and greedy decoding. On a CPU the ops run under Triton's interpreter (``kernels.ON_CPU``,
tests/kernels/conftest.py sets TRITON_INTERPRET); on a GPU the same checks run on CUDA.

Then CUDA graphs (engine/cuda_graphs.py), emulated on a CPU and recorded for real on CUDA: static
inputs, outputs replayed into the recorded buffers, warm-ups that do not advance the state, one
graph per batch buffers / tree size, and graphed decoding equal to eager.
"""

from __future__ import annotations

import importlib
import os
import random

import pytest
import torch

from engine import kernels
from engine.generate import Decoder, run_generation
from engine.loading import build, load, read_config, read_state_dict
from engine.strategy import preset

from ..test_granite_hybrid import SPECS as GRANITE_SPECS, hf_granite
from ..test_mamba2 import IDS, hf_mamba2, path_rows, random_tree

pytestmark = pytest.mark.skipif(not kernels.HAS_TRITON, reason="triton is a dev dependency (pip install -e .[dev])")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-4  # fp32 logits: the two paths differ only in summation order
BUILDERS = {"mamba2-g1": lambda: hf_mamba2("g1"), "mamba2-g2": lambda: hf_mamba2("g2"),
            "granite-nope": lambda: hf_granite(GRANITE_SPECS["nope"])}


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    out = {}
    for name, make in BUILDERS.items():
        path = tmp_path_factory.mktemp(name)
        make().save_pretrained(path)
        out[name] = path
    return out


def model(path):
    """Our model of a saved checkpoint, fp32, on DEV (a model lives where its weights are)."""
    if DEV == "cpu":
        m = load(str(path)).model
    else:
        sd = {k: v.to(DEV) for k, v in read_state_dict(path).items()}
        m = build(read_config(path), sd, torch.float32, 2048, str(path))
    m.allocate()
    return m


@pytest.fixture
def triton_path(monkeypatch):
    """Run the engine's Triton dispatch: on a CPU under the interpreter (kernels.ON_CPU)."""
    if DEV == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("the Triton path on a CPU needs TRITON_INTERPRET=1 before triton is imported")
        monkeypatch.setattr(kernels, "ON_CPU", True)
    monkeypatch.setattr(kernels, "USE_TRITON", True)


def with_triton(monkeypatch, on: bool) -> None:
    monkeypatch.setattr(kernels, "ON_CPU", on and DEV == "cpu")
    monkeypatch.setattr(kernels, "USE_TRITON", on)


def states(m):
    c = m.cache.ssm if hasattr(m.cache, "kv") else m.cache
    return c.conv.clone(), c.ssm.clone()


def close(a, b, tol=TOL) -> float:
    err = (a.float() - b.float()).abs().max().item()
    assert err <= tol * max(1.0, b.float().abs().max().item()), err
    return err


@pytest.mark.parametrize("name", list(BUILDERS))
def test_verify_commit_and_extend_equal_the_pytorch_path(name, saved_models, monkeypatch, triton_path):
    """Prefill (a chain: fused multi-step update), a tree verify (tree conv + tree scan), a chain
    verify, commit (fused replay) and an extend (the PyTorch path on top of Triton-made scratch)."""
    m = model(saved_models[name])
    tokens, parents = random_tree(random.Random(3), 11)
    chain = IDS[20:27]
    rows = path_rows(parents, 10)
    got = {}
    for on in (False, True):
        with_triton(monkeypatch, on)
        m.cache.reset()
        m.prefill(IDS[:17], chunk=8)
        r = {"prefill": states(m), "tree": m.verify(tokens, parents).clone(), "chain": m.verify(chain, list(range(-1, 6))).clone()}
        m.verify(tokens[:6], parents[:6])
        r["extend"] = m.extend(tokens[6:], parents[6:]).clone()
        m.commit(rows)
        r["commit"] = states(m)
        r["next"] = m.verify([IDS[30]], [-1]).clone()
        got[on] = r
    ref, tri = got[False], got[True]
    errs = {k: close(tri[k], ref[k]) for k in ("tree", "chain", "extend", "next")}
    for k in ("prefill", "commit"):
        errs[k] = max(close(a, b) for a, b in zip(tri[k], ref[k]))
    print(name, {k: f"{v:.1e}" for k, v in errs.items()})


@pytest.mark.parametrize("name", list(BUILDERS))
def test_drafting_rows_equal_the_pytorch_path(name, saved_models, monkeypatch, triton_path):
    """fork(n), step (the in-place fused update), fork(parent_rows) (state gather), step."""
    m = model(saved_models[name])
    got = {}
    for on in (False, True):
        with_triton(monkeypatch, on)
        m.cache.reset()
        m.prefill(IDS[:12])
        b = m.fork(3)
        out = [b.step(torch.tensor([1, 2, 3])).clone()]
        b = b.fork(torch.tensor([2, 0, 0, 1]))
        out.append(b.step(torch.tensor([4, 5, 6, 7])).clone())
        out.append(b.step(torch.tensor([8, 9, 10, 11])).clone())
        got[on] = out + [b.state["ssm"].clone(), b.state["conv"].clone()]
    for a, b in zip(got[True], got[False]):
        close(a, b)


@pytest.mark.parametrize("name, strategies", [("mamba2-g2", ("sd", "tree")), ("granite-nope", ("sd",))])
def test_greedy_decoding_through_the_kernels_equals_plain_greedy(name, strategies, saved_models, monkeypatch, triton_path):
    """Speculative greedy with every op on Triton (self-drafting: chains and a tree) emits plain
    greedy's tokens, as the PyTorch path does."""
    m = model(saved_models[name])
    prompt = [1, 5, 9, 3, 5, 9, 3, 7, 2, 5, 9]
    with_triton(monkeypatch, False)
    dec = Decoder(m, m)
    want = [t for e in run_generation(dec, prompt, preset("ar"), 10)[0] for t in e.emitted]
    with_triton(monkeypatch, True)
    for s in [{"sd": preset("sd", draft_len=4), "tree": preset("tree", tree=(2, 2, 1))}[k] for k in strategies]:
        dec.reset()
        evs, _ = run_generation(dec, prompt, s, 10)
        assert [t for e in evs for t in e.emitted] == want, s.label()
        assert all(e.accepted == (4 if s.name == "sd" else 3) for e in evs[:-1])


def test_the_switch_is_an_environment_flag_read_once(monkeypatch):
    """SPECCHAT_TRITON=0 turns the dispatch off; the flag is resolved when kernels is imported."""
    try:
        for val, want in (("0", False), ("off", False), ("1", kernels.HAS_TRITON)):
            monkeypatch.setenv("SPECCHAT_TRITON", val)
            importlib.reload(kernels)
            assert kernels.USE_TRITON is want, val
            assert kernels.use_triton(torch.zeros(1, device=DEV)) is (want and DEV == "cuda")
    finally:
        monkeypatch.undo()  # the environment as it was, then the flags as it makes them
        importlib.reload(kernels)


# ---- CUDA graphs (emulated on a CPU) -------------------------------------------------------------------------
def test_graph_set_records_once_per_key_and_replays_into_static_buffers():
    from engine.cuda_graphs import GraphSet

    gs = GraphSet("cpu", emulate=True)
    state = torch.zeros(3)

    def fn(x):
        state.add_(x)  # updated in place: the caller's call must advance it once, not once per warm-up
        return {"sum": state * 2, "x": x + 0}

    out = gs.run(("k", 3), fn, {"x": torch.ones(3)}, mutated=(state,))
    assert torch.equal(state, torch.ones(3)) and torch.equal(out["sum"], 2 * torch.ones(3))
    buf = out["sum"]
    out2 = gs.run(("k", 3), fn, {"x": torch.full((3,), 2.0)}, mutated=(state,))
    assert out2["sum"] is buf and torch.equal(state, torch.full((3,), 3.0)) and torch.equal(buf, torch.full((3,), 6.0))
    assert len(gs) == 1 and gs.replays == 2
    with pytest.raises(ValueError, match="CUDA device"):
        GraphSet("cpu")
    assert GraphSet.for_device("cpu") is None


@pytest.mark.parametrize("name, kernels_on", [("mamba2-g2", True), ("mamba2-g1", False)], ids=["g2-triton", "g1-torch"])
def test_graphed_drafting_and_verify_equal_eager(name, kernels_on, saved_models, monkeypatch):
    """With graphs (emulated on a CPU, recorded on CUDA): draft rows step from per-(depth, rows)
    graphs, fresh verifies replay one graph per tree size and committed-state buffer, and
    everything equals eager."""
    if kernels_on and DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton path on a CPU needs TRITON_INTERPRET=1")
    with_triton(monkeypatch, kernels_on)
    m = model(saved_models[name])
    tokens, parents = random_tree(random.Random(1), 9)
    got = {}
    for graphs in (False, True):
        assert m.use_cuda_graphs(graphs, emulate=DEV == "cpu") == graphs
        out = []
        for rnd in range(2):  # the second round replays: the state buffers alternate on commit
            m.cache.reset()
            m.prefill(IDS[:10 + rnd])
            out.append(m.verify(tokens, parents).clone())
            m.commit(path_rows(parents, 8))
            out.append(m.verify(IDS[30:33], [-1, 0, 1]).clone())
            m.commit([0, 1])
            m.rollback(m.length - 1)  # into the last commit: its replayed path (a graph's buffers when graphed)
            out.append(m.cache.ssm.clone())
            out.append(m.verify([5], [-1]).clone())
            m.commit([0])
            b = m.fork(2)
            out.append(b.step(torch.tensor([3, 4])).clone())
            out.append(b.step(torch.tensor([5, 6])).clone())
            b = b.fork(torch.tensor([1, 1, 0]))
            out.append(b.step(torch.tensor([7, 8, 9])).clone())
            out.append(m.cache.ssm.clone())
        got[graphs] = out
        if graphs:
            g = m.graphs
            kinds = sorted({k[0] for k in g.graphs})
            assert kinds == ["commit", "step", "verify"] and len(g) == len(g.graphs)
            # commits after graphed verifies: one per verify graph, accepted length and state buffer
            assert {k[2] for k in g.graphs if k[0] == "commit"} == {1, 2, len(path_rows(parents, 8))}
            # steps: one graph per batch buffers (depth 0 with 2 rows, depth 1 with 3); verifies: a
            # tree of 9 and a chain of 3, each on either committed-state buffer at most
            assert len([k for k in g.graphs if k[0] == "step"]) == 2
            assert len([k for k in g.graphs if k[0] == "verify"]) <= 6
            assert g.replays > len(g)
    for a, b in zip(got[True], got[False]):
        close(a, b, 1e-5)  # the same kernels replayed: equal up to a library's choice of algorithm
    m.use_cuda_graphs(False)


def test_graphed_self_drafting_equals_plain_greedy(saved_models):
    """The decode loop with graphs on (the drafter's steps and its own one-token verifies, the
    target's 5-node verifies) emits plain greedy's tokens."""
    m = model(saved_models["mamba2-g1"])
    prompt = [1, 5, 9, 3, 5, 9, 3, 7, 2, 5, 9]
    want = [t for e in run_generation(Decoder(m, m), prompt, preset("ar"), 20)[0] for t in e.emitted]
    m.use_cuda_graphs(True, emulate=DEV == "cpu")
    dec = Decoder(m, m)  # the drafter is a copy of m: it shares m's graphs (keyed by buffer addresses)
    evs, _ = run_generation(dec, prompt, preset("sd", draft_len=4), 20)
    assert [t for e in evs for t in e.emitted] == want
    assert all(e.accepted == 4 for e in evs[:-1])
    assert len(m.graphs) >= 2
    m.use_cuda_graphs(False)


def test_graphed_hybrid_verify_equals_eager_and_decodes_greedily(saved_models):
    """Granite-4.0-H: a fresh verify replays each run of Mamba layers from a graph (one per run,
    tree size and committed-state buffer), the attention layers run eagerly between them; verify,
    commit and self-drafted greedy decoding equal eager."""
    m = model(saved_models["granite-nope"])
    tokens, parents = random_tree(random.Random(2), 7)
    prompt = [1, 5, 9, 3, 5, 9, 3, 7, 2, 5, 9]
    want = [t for e in run_generation(Decoder(m, m), prompt, preset("ar"), 10)[0] for t in e.emitted]
    got = {}
    for graphs in (False, True):
        assert m.use_cuda_graphs(graphs, emulate=DEV == "cpu") == graphs
        out = []
        for rnd in range(2):
            m.cache.reset()
            m.prefill(IDS[:9 + rnd])
            out.append(m.verify(tokens, parents).clone())
            m.commit(path_rows(parents, 6))
            out.append(m.verify(IDS[30:33], [-1, 0, 1]).clone())
            m.commit([0, 1, 2])
            out += [m.cache.ssm.ssm.clone(), m.cache.kv.k[:, :, :m.length].clone()]
        got[graphs] = out
    assert {k[0] for k in m.graphs.graphs} == {"mamba-run"} and {k[1] for k in m.graphs.graphs} == {0, 2}
    assert len(m.graphs) == len(m.graphs.graphs)  # every recording succeeded
    for a, b in zip(got[True], got[False]):
        close(a, b, 1e-5)
    evs, _ = run_generation(Decoder(m, m), prompt, preset("sd", draft_len=3), 10)
    assert [t for e in evs for t in e.emitted] == want
    m.use_cuda_graphs(False)
