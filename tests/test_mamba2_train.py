"""engine/mamba2_train.py: the leaner chunked SSD scan `distill train` swaps into transformers'
Mamba-2 is the same function as transformers' own PyTorch path (values and gradients), and the
swap is in place during training only."""

from __future__ import annotations

import pytest
import torch

mm = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")

from engine import mamba2_train  # noqa: E402


def _inputs(L: int, groups: int, seed: int = 0, initial: bool = False):
    g = torch.Generator().manual_seed(seed)
    b, h, p, n = 2, 6, 4, 8
    x = torch.randn(b, L, h, p, generator=g, dtype=torch.float64)
    dt = torch.randn(b, L, h, generator=g, dtype=torch.float64)
    A = -torch.rand(h, generator=g, dtype=torch.float64) * 2 - 0.1
    B = torch.randn(b, L, groups, n, generator=g, dtype=torch.float64)
    C = torch.randn(b, L, groups, n, generator=g, dtype=torch.float64)
    D = torch.randn(h, generator=g, dtype=torch.float64)
    dt_bias = torch.randn(h, generator=g, dtype=torch.float64)
    init = torch.randn(b, h, p, n, generator=g, dtype=torch.float64) if initial else None
    return x, dt, A, B, C, D, dt_bias, init


@pytest.mark.parametrize("L,chunk,groups,initial", [(40, 16, 1, False), (32, 16, 2, False), (23, 8, 3, True), (5, 16, 1, True)])
def test_chunk_scan_equals_transformers_values_and_gradients(L, chunk, groups, initial):
    """Chunks that divide the length and chunks that leave a padded tail, one group and several,
    with and without an initial state: the outputs, the final state and the gradients of every
    input agree with transformers' fallback in float64 (the reference computes in fp32: both
    upcast, so compare at fp32 precision)."""
    outs = {}
    for name, fn in (("ref", mm.mamba2_chunk_scan), ("lean", mamba2_train.chunk_scan)):
        args = [t.clone().requires_grad_(True) if t is not None else None for t in _inputs(L, groups, initial=initial)]
        x, dt, A, B, C, D, dt_bias, init = args
        y, final = fn(x, dt, A, B, C, chunk_size=chunk, D=D, dt_bias=dt_bias, initial_states=init, dt_softplus=True,
                      dt_limit=(0.0, float("inf")), return_final_states=True)
        w = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)
        ((y * w).sum() + final.square().sum()).backward()
        outs[name] = (y.detach(), final.detach(), [t.grad for t in args if t is not None])
    ref, lean = outs["ref"], outs["lean"]
    assert lean[0].shape == ref[0].shape and lean[1].shape == ref[1].shape
    torch.testing.assert_close(lean[0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lean[1], ref[1], rtol=1e-5, atol=1e-5)
    for gl, gr in zip(lean[2], ref[2]):
        torch.testing.assert_close(gl, gr, rtol=1e-4, atol=1e-5)


def test_chunk_scan_without_the_final_state_and_dt_limit():
    x, dt, A, B, C, D, dt_bias, _ = _inputs(20, 1, seed=3)
    kw = dict(chunk_size=8, D=D, dt_bias=dt_bias, dt_softplus=True, dt_limit=(0.01, 0.5))
    torch.testing.assert_close(mamba2_train.chunk_scan(x, dt, A, B, C, **kw), mm.mamba2_chunk_scan(x, dt, A, B, C, **kw),
                               rtol=1e-5, atol=1e-5)


def test_a_mamba2_model_trains_the_same_through_it_and_the_swap_is_undone():
    """A tiny Mamba2ForCausalLM: loss and every parameter's gradient match transformers' own path
    inside the block; outside it transformers' function is back."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    cfg = Mamba2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=8, head_dim=8, num_heads=8,
                       n_groups=1, expand=2, conv_kernel=4, chunk_size=16)
    torch.manual_seed(0)
    model = Mamba2ForCausalLM(cfg).train()
    ids = torch.randint(0, 64, (2, 37))

    def grads():
        model.zero_grad(set_to_none=True)
        out = model(ids, labels=ids)
        out.loss.backward()
        return out.loss.item(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    original = mm.mamba2_chunk_scan
    ref_loss, ref = grads()
    with mamba2_train.lean_scan() as swapped:
        assert swapped and mm.mamba2_chunk_scan is mamba2_train.chunk_scan
        loss, got = grads()
    assert mm.mamba2_chunk_scan is original
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert got.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-3, atol=1e-6)


def test_distill_train_runs_inside_the_swap(monkeypatch, tmp_path):
    """cmd_train trains with the lean scan in place and restores transformers' afterwards."""
    from engine import distill_train

    seen = []
    monkeypatch.setattr(distill_train, "_train", lambda args: seen.append(mm.mamba2_chunk_scan) or 0)
    original = mm.mamba2_chunk_scan
    assert distill_train.cmd_train(None) == 0
    assert seen == [mamba2_train.chunk_scan] and mm.mamba2_chunk_scan is original


def test_the_swap_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("SPECCHAT_LEAN_SCAN", "0")
    original = mm.mamba2_chunk_scan
    with mamba2_train.lean_scan() as swapped:
        assert not swapped and mm.mamba2_chunk_scan is original


@pytest.mark.parametrize("n,chunk", [(300, 64), (257, 256), (40, 512)])
def test_chunked_cross_entropy_equals_cross_entropy_values_and_gradients(n, chunk):
    """`distill train`'s output-layer loss a chunk at a time (gradients made in the forward) is
    F.cross_entropy(h @ W.T, y, ignore_index=-1): value and both gradients, ignored rows and a
    last partial chunk included, scaled by the outer gradient; NaN where no row counts, as it."""
    g = torch.Generator().manual_seed(n)
    d, V = 24, 500
    h0 = torch.randn(n, d, generator=g, dtype=torch.float64)
    W0 = torch.randn(V, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (n,), generator=g)
    y[::5] = -1
    grads = []
    for f in (lambda h, W: torch.nn.functional.cross_entropy(h @ W.T, y, ignore_index=-1),
              lambda h, W: mamba2_train.chunked_cross_entropy(h, W, y, chunk=chunk, mm_dtype=torch.float64)):
        h, W = h0.clone().requires_grad_(), W0.clone().requires_grad_()
        loss = f(h, W)
        (3.0 * loss).backward()
        grads.append((loss.detach(), h.grad, W.grad))
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    h = h0.clone().requires_grad_()
    assert torch.isnan(mamba2_train.chunked_cross_entropy(h, W0, torch.full((n,), -1), chunk=chunk, mm_dtype=torch.float64))


def test_chunked_cross_entropy_in_bf16_products_stays_close():
    """With bf16 products (`distill train --amp bf16`) the loss and gradients stay within bf16's
    rounding of the fp32 ones."""
    g = torch.Generator().manual_seed(1)
    h0, W0 = torch.randn(200, 32, generator=g), torch.randn(700, 32, generator=g) * 0.3
    y = torch.randint(0, 700, (200,), generator=g)
    out = []
    for dt in (torch.float32, torch.bfloat16):
        h, W = h0.clone().requires_grad_(), W0.clone().requires_grad_()
        loss = mamba2_train.chunked_cross_entropy(h, W, y, chunk=64, mm_dtype=dt)
        loss.backward()
        assert h.grad.dtype == torch.float32 and W.grad.dtype == torch.float32
        out.append((loss.detach(), h.grad, W.grad))
    assert abs(float(out[0][0] - out[1][0])) < 0.02 * float(out[0][0])
    for a, b in zip(out[0][1:], out[1][1:]):
        assert float((a - b).norm() / a.norm()) < 0.03
