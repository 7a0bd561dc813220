"""Session 47: sampling.top_values (engine/native/select.c) gives torch.topk's values bit for bit:
peaked and flat rows, exact ties, negative values, row lengths that are not a multiple of 16, more
wanted values than the kernel has blocks for, strided rows, huge negatives; a NaN or an infinity
leaves the row to torch. Oracle: torch.topk."""

from __future__ import annotations

import pytest
import torch

from engine import native
from engine.sampling import probs_from_logits, top_values

needs_c = pytest.mark.skipif(native.lib() is None, reason="the C kernels are off here")


def _rows(V, R, g, kind):
    x = torch.randn(R, V, generator=g)
    if kind == "peaked":
        return torch.softmax(x * 8, -1)
    if kind == "flat":
        return torch.softmax(x * 0.1, -1)
    if kind == "ties":
        return torch.softmax((x * 2).round() / 2, -1)
    if kind == "logits":  # negatives and positives
        return x * 5
    if kind == "huge-negatives":
        return -3e38 * torch.rand(R, V, generator=g) - 1e38
    if kind == "zeros":  # a cut distribution: most entries exactly 0
        p = torch.softmax(x * 3, -1)
        return p.masked_fill(p < p.topk(min(5, V), -1).values[:, -1:], 0.0)
    raise ValueError(kind)


@needs_c
@pytest.mark.parametrize("V", [49152, 49157, 1000, 257, 40])
@pytest.mark.parametrize("kind", ["peaked", "flat", "ties", "logits", "huge-negatives", "zeros"])
def test_top_values_are_torch_topks(V, kind):
    g = torch.Generator().manual_seed(V)
    for R in (1, 3, 16):
        x = _rows(V, R, g, kind)
        for m in sorted({1, 2, 15, 40, 64, 256, 1000, V - 1} & set(range(1, V))):
            got = top_values(x, m)
            assert got.shape == (R, m)
            assert torch.equal(got, x.topk(m, -1).values), (R, m)


@needs_c
def test_strided_and_batched_rows():
    g = torch.Generator().manual_seed(3)
    x = torch.softmax(torch.randn(4, 2, 3000, generator=g) * 4, -1)
    assert torch.equal(top_values(x, 64), x.topk(64, -1).values)  # (..., V): leading dims kept
    wide = torch.randn(5, 4000, generator=g)
    col = wide[:, 500:3500]  # rows with a stride over the length
    assert torch.equal(top_values(col, 40), col.topk(40, -1).values)
    t = torch.randn(3000, 5, generator=g).t()  # a transposed view: not unit stride
    assert torch.equal(top_values(t, 40), t.topk(40, -1).values)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_nan_or_an_infinity_goes_to_torch(bad):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 5000, generator=g)
    x[1, 4321] = bad
    got, want = top_values(x, 40), x.topk(40, -1).values
    assert torch.equal(got.nan_to_num(), want.nan_to_num()) and torch.equal(got.isnan(), want.isnan())


def test_other_dtypes_and_the_whole_row_go_to_torch():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 300, generator=g)
    assert torch.equal(top_values(x.double(), 10), x.double().topk(10, -1).values)
    assert torch.equal(top_values(x.bfloat16(), 10), x.bfloat16().topk(10, -1).values)
    assert torch.equal(top_values(x, 300), x.topk(300, -1).values)


@needs_c
def test_top_k_cut_uses_it_and_keeps_the_ties():
    """probs_from_logits' top-k through the kernel: the k most likely and every token tied with the
    k-th, as transformers' TopKLogitsWarper keeps them."""
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.5] + [-1.0] * 60])
    p = probs_from_logits(logits, 1.0, top_k=2)
    assert (p[0, :5] > 0).tolist() == [True, False, True, True, False] and float(p.sum()) == pytest.approx(1.0)


def test_nucleus_fast_and_tie_paths_give_the_sorts_bits(monkeypatch):
    """nucleus keeps every token tied at the cut where all of them are kept (one compare), and the
    lowest ids of them where only some are (a tie straddling the cut): both as the stable sort."""
    from engine import sampling

    calls = {"cumsum": 0}
    real = torch.Tensor.cumsum

    def counting(self, *a, **k):
        calls["cumsum"] += self.dtype == torch.bool
        return real(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "cumsum", counting)
    straddle = torch.tensor([[0.2] * 5 + [0.0] * 100]) + torch.zeros(1, 105)  # 5 tied; top-p 0.3 keeps 2 of them
    straddle = straddle / straddle.sum()
    got = sampling.nucleus(straddle, 0.3)
    assert torch.equal(got, sampling.nucleus_by_sort(straddle, 0.3)) and int((got > 0).sum()) == 2
    assert calls["cumsum"] == 1  # the tie path
    calls["cumsum"] = 0
    g = torch.Generator().manual_seed(8)
    peaked = torch.softmax(torch.randn(4, 49152, generator=g) * 6, -1)
    for p in (0.5, 0.9, 0.95):
        assert torch.equal(sampling.nucleus(peaked, p), sampling.nucleus_by_sort(peaked, p))
    assert calls["cumsum"] == 0  # the fast path: no tie straddles these cuts
