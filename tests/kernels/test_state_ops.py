"""Kernels against their plain-PyTorch references over odd sizes (STYLE.md item 5): the state
gather of drafter forks, Mamba-2's fused multi-step state update (chains, path replay, in place,
state only), the tree scan and the tree conv; bf16 inputs judged against PyTorch's own bf16 error."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import HAS_TRITON
from engine.kernels.ssd_update import ssd_update, ssd_update_ref
from engine.kernels.state_gather import state_gather, state_gather_ref

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is a dev dependency (pip install -e .[dev])")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("L, B, F, J", [(1, 1, 1, 1), (3, 5, 37, 7), (2, 4, (3, 16, 8), 9), (4, 2, 1031, 3)])
def test_state_gather_equals_index_select(L, B, F, J):
    g = torch.Generator().manual_seed(0)
    shape = (L, B, *(F if isinstance(F, tuple) else (F,)))
    state = torch.randn(shape, generator=g).to(DEV)
    idx = torch.randint(0, B, (J,), generator=g).to(DEV)
    assert torch.equal(state_gather(state, idx), state_gather_ref(state, idx))


def _inputs(R, T, H, P, G, N, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    state = torch.randn(R, H, P, N, generator=g)
    x = torch.randn(R, T, H, P, generator=g).to(dtype)
    B = torch.randn(R, T, G, N, generator=g).to(dtype)
    C = torch.randn(R, T, G, N, generator=g).to(dtype)
    dt = torch.nn.functional.softplus(torch.randn(R, T, H, generator=g) - 1)
    A = -torch.rand(H, generator=g) * 4 - 0.1
    D = torch.randn(H, generator=g)
    return [t.to(DEV) for t in (state, x, B, C, dt, A, D)]


SIZES = [(1, 1, 1, 1, 1, 1), (2, 6, 4, 16, 1, 16), (3, 5, 6, 7, 3, 9), (1, 8, 8, 64, 2, 64), (2, 3, 2, 33, 2, 5)]


@pytest.mark.parametrize("R, T, H, P, G, N", SIZES)
def test_ssd_update_equals_the_stepwise_recurrence(R, T, H, P, G, N):
    state, x, B, C, dt, A, D = _inputs(R, T, H, P, G, N)
    for d in (D, None):
        y, s = ssd_update(state, x, B, C, dt, A, d)
        y_ref, s_ref = ssd_update_ref(state, x, B, C, dt, A, d)
        err = max((y - y_ref).abs().max().item(), (s - s_ref).abs().max().item())
        print(f"ssd_update R{R} T{T} H{H} P{P} G{G} N{N}: max abs err {err:.2e}")
        assert torch.allclose(y, y_ref, atol=1e-4, rtol=1e-4) and torch.allclose(s, s_ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("R, T, H, P, G, N", SIZES[1:])
def test_ssd_update_replays_a_path_given_node_indices(R, T, H, P, G, N):
    """Replay (Snakes and Ladders §3.3): the state after an accepted path of tree nodes, read in
    place by index, equals running the recurrence on those nodes laid out as a chain."""
    state, x, B, C, dt, A, D = _inputs(R, T, H, P, G, N, seed=1)
    g = torch.Generator().manual_seed(2)
    M = max(1, T // 2)
    path = torch.stack([torch.sort(torch.randperm(T, generator=g)[:M]).values for _ in range(R)]).to(DEV)
    y, s = ssd_update(state, x, B, C, dt, A, D, path=path)
    take = lambda t: torch.stack([t[r, path[r]] for r in range(R)])  # noqa: E731
    y_chain, s_chain = ssd_update_ref(state, take(x), take(B), take(C), take(dt), A, D)
    assert torch.allclose(y, y_chain, atol=1e-4, rtol=1e-4) and torch.allclose(s, s_chain, atol=1e-4, rtol=1e-4)


def test_ssd_update_in_bf16_is_as_close_as_torch_s_own_bf16():
    """Low-precision inputs: the kernel's error against the fp32 reference stays within a small
    multiple of what the reference itself loses when fed the same bf16-rounded inputs."""
    state, x, B, C, dt, A, D = _inputs(2, 6, 4, 32, 2, 16, seed=3)
    exact = ssd_update_ref(state, x, B, C, dt, A, D)[0]
    xb, Bb, Cb = x.bfloat16(), B.bfloat16(), C.bfloat16()
    ref_err = (ssd_update_ref(state, xb, Bb, Cb, dt, A, D)[0] - exact).abs().max().item()
    ker_err = (ssd_update(state, xb, Bb, Cb, dt, A, D)[0] - exact).abs().max().item()
    print(f"bf16 inputs: reference err {ref_err:.2e}, kernel err {ker_err:.2e}")
    assert ker_err <= 2 * ref_err + 1e-5


def _tree(shape_parents):
    return torch.tensor(shape_parents, dtype=torch.int64)


TREES = [[-1], [-1, 0, 1, 2], [-1, -1, 0, 0, 1, 2, 5], [-1, -1, -1, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 9]]


@pytest.mark.parametrize("parents", TREES, ids=lambda p: f"T{len(p)}")
@pytest.mark.parametrize("H, P, G, N", [(1, 1, 1, 1), (4, 16, 2, 16), (6, 7, 3, 9)])
def test_tree_scan_equals_the_recurrence_and_the_engine_s_quadratic_form(parents, H, P, G, N):
    from engine.models.mamba2 import tree_scan as engine_tree_scan
    from engine.kernels.tree_scan import tree_scan, tree_scan_ref

    T = len(parents)
    state, x, B, C, dt, A, _ = _inputs(1, T, H, P, G, N, seed=T + H)
    state, x, B, C, dt = state[0], x[0], B[0], C[0], dt[0]
    par = _tree(parents).to(DEV)
    y, states = tree_scan(state, x, B, C, dt, A, par, keep_states=True)
    y_ref, states_ref = tree_scan_ref(state, x, B, C, dt, A, par, keep_states=True)
    assert torch.allclose(y, y_ref, atol=1e-4, rtol=1e-4) and torch.allclose(states, states_ref, atol=1e-4, rtol=1e-4)
    anc = torch.eye(T, dtype=torch.bool)
    for i, q in enumerate(parents):
        if q >= 0:
            anc[i] |= anc[q]
    y_engine = engine_tree_scan(C.cpu(), x.cpu(), B.cpu(), dt.cpu(), (dt * A).cpu(), anc, state.cpu())
    assert torch.allclose(y.cpu(), y_engine, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("parents", TREES, ids=lambda p: f"T{len(p)}")
@pytest.mark.parametrize("C, K", [(1, 2), (37, 4), (300, 4), (8, 3)])
def test_tree_conv1d_equals_its_reference(parents, C, K):
    from engine.kernels.tree_conv1d import tree_conv1d, tree_conv1d_ref

    g = torch.Generator().manual_seed(C + K)
    T = len(parents)
    conv_state, x = torch.randn(C, K - 1, generator=g).to(DEV), torch.randn(T, C, generator=g).to(DEV)
    w, b = torch.randn(K, C, generator=g).to(DEV), torch.randn(C, generator=g).to(DEV)
    par = _tree(parents).to(DEV)
    for bias in (b, None):
        assert torch.allclose(tree_conv1d(conv_state, x, w, bias, par), tree_conv1d_ref(conv_state, x, w, bias, par), atol=1e-5)


def test_tree_conv1d_reference_on_a_chain_is_torch_s_causal_conv1d():
    """Independent oracle for the reference: on a chain the tree conv is an ordinary depthwise
    causal conv over the committed inputs followed by the chain."""
    from engine.kernels.tree_conv1d import tree_conv1d_ref

    g = torch.Generator().manual_seed(0)
    C, K, T = 5, 4, 6
    conv_state, x, w = torch.randn(C, K - 1, generator=g), torch.randn(T, C, generator=g), torch.randn(K, C, generator=g)
    seq = torch.cat([conv_state, x.t()], dim=1)[None]  # (1, C, K-1+T)
    ref = torch.nn.functional.conv1d(seq, w.t()[:, None, :], groups=C)[0].t()  # (T, C)
    assert torch.allclose(tree_conv1d_ref(conv_state, x, w, None, torch.arange(-1, T - 1)), ref, atol=1e-5)


@pytest.mark.parametrize("parents", TREES[1:], ids=lambda p: f"T{len(p)}")
def test_tree_ops_in_bf16_are_as_close_as_torch_s_own_bf16(parents):
    """The tree scan and the tree conv fed bf16 inputs (the engine's model dtype): their error
    against the fp32 reference stays within a small multiple of the reference's own error on the
    same bf16-rounded inputs (STYLE.md item 5)."""
    from engine.kernels.tree_conv1d import tree_conv1d, tree_conv1d_ref
    from engine.kernels.tree_scan import tree_scan, tree_scan_ref

    T = len(parents)
    par = _tree(parents).to(DEV)
    state, x, B, C, dt, A, _ = _inputs(1, T, 6, 40, 2, 24, seed=T)
    state, x, B, C, dt = state[0], x[0], B[0], C[0], dt[0]
    exact = tree_scan_ref(state, x, B, C, dt, A, par)
    low = [t.bfloat16() for t in (x, B, C)]
    ref_err = (tree_scan_ref(state, *low, dt, A, par) - exact).abs().max().item()
    ker_err = (tree_scan(state, *low, dt, A, par) - exact).abs().max().item()
    print(f"tree_scan T{T} bf16 inputs: reference err {ref_err:.2e}, kernel err {ker_err:.2e}")
    assert ker_err <= 2 * ref_err + 1e-5

    g = torch.Generator().manual_seed(T)
    Cc, K = 300, 4
    args = [torch.randn(Cc, K - 1, generator=g), torch.randn(T, Cc, generator=g), torch.randn(K, Cc, generator=g), torch.randn(Cc, generator=g)]
    args = [a.to(DEV) for a in args]
    exact = tree_conv1d_ref(*args, par.cpu())
    low = [a.bfloat16() for a in args]
    ref_err = (tree_conv1d_ref(*low, par.cpu()) - exact).abs().max().item()
    ker_err = (tree_conv1d(*low, par) - exact).abs().max().item()
    print(f"tree_conv1d T{T} bf16 inputs: reference err {ref_err:.2e}, kernel err {ker_err:.2e}")
    assert ker_err <= 2 * ref_err + 1e-5


@pytest.mark.parametrize("R, T, H, P, G, N", SIZES[1:])
def test_ssd_update_in_place_and_state_only(R, T, H, P, G, N):
    """out=state updates the state in place (the drafter's one-token step); C=None returns only
    the state (the replay of commit)."""
    state, x, B, C, dt, A, D = _inputs(R, T, H, P, G, N, seed=5)
    y_ref, s_ref = ssd_update_ref(state, x, B, C, dt, A, D)
    work = state.clone()
    y, s = ssd_update(work, x, B, C, dt, A, D, out=work)
    assert s is work and torch.allclose(work, s_ref, atol=1e-4, rtol=1e-4) and torch.allclose(y, y_ref, atol=1e-4, rtol=1e-4)
    out = torch.empty_like(state)
    y, s = ssd_update(state, x, B, None, dt, A, out=out)
    assert y is None and s is out and torch.allclose(out, s_ref, atol=1e-4, rtol=1e-4)
    assert ssd_update_ref(state, x, B, None, dt, A)[0] is None


def test_state_gather_into_a_pool_buffer():
    state = torch.randn(3, 4, 5, 6).to(DEV)
    idx = torch.tensor([3, 0, 0]).to(DEV)
    out = torch.empty(3, 3, 5, 6).to(DEV)
    assert state_gather(state, idx, out=out) is out and torch.equal(out, state_gather_ref(state, idx))
