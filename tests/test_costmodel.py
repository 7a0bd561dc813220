"""The verify-cost model: the fit recovers known coefficients, measurement runs on a real model,
and the cap on tree size follows the cost curve."""

from __future__ import annotations

import pytest

from engine.costmodel import VerifyCost, fit, measure
from engine.loading import load

from .tiny import saved


def test_fit_recovers_linear_and_quadratic_costs():
    pts = {n: 20.0 + 0.5 * n for n in (1, 2, 4, 8, 16, 32)}
    c = fit(pts)
    assert c.a == pytest.approx(20.0) and c.b == pytest.approx(0.5) and c.c == 0.0
    pts = {n: 10.0 + 0.2 * n + 0.01 * n * n for n in (1, 2, 4, 8, 16, 32)}
    c = fit(pts, quadratic=True)
    assert (c.a, c.b, c.c) == pytest.approx((10.0, 0.2, 0.01))
    assert c.relative(16) == pytest.approx(c(16) / c(1))
    with pytest.raises(ValueError):
        fit({1: 1.0})


def test_max_worthwhile_caps_where_bigger_trees_stop_paying():
    cost = VerifyCost(a=20.0, b=1.0)  # t(1) = 21 ms, t(n) grows 1 ms per row
    # expected tokens per pass saturate at 3: beyond the knee the extra rows only cost time
    expected = [1.0, 1.8, 2.4, 2.8, 3.0, 3.0, 3.0, 3.0]
    n = cost.max_worthwhile(expected)
    assert n == 5  # 3.0 / 25 ms beats 2.8 / 24 ms and every larger n
    assert VerifyCost(a=1.0, b=10.0).max_worthwhile(expected) == 1  # verify is expensive: stay plain


def test_measure_on_a_real_model(tmp_path):
    m = load(str(saved("llama", str(tmp_path)))).model
    pts = measure(m, sizes=(1, 4, 16), prefix=16, repeats=2)
    assert set(pts) == {1, 4, 16} and all(v > 0 for v in pts.values())
    assert m.cache.length == 0


def test_measure_takes_the_sizes_in_turns_so_a_slow_spell_falls_on_all_of_them(monkeypatch):
    """Session 48: sizes measured one after another let a slow spell of a shared machine land on
    one size (a 16-row pass at 14 ms between 8 and 24 rows at 7 and 11), and the tree policies
    read that bump. A fake model whose passes cost n ms, plus 50 ms during the first six timed
    passes: in turns, each size gets at most two slow samples of five, so every median stays n."""

    class Clockwork:
        vocab_size = 50

        def __init__(self):
            self.order, self.now, self.timed = [], 0.0, 0
            self.cache = type("C", (), {"reset": lambda _self: None, "length": 0})()

        def allocate(self, n):
            pass

        def prefill(self, ids):
            pass

        def verify(self, toks, parents):
            self.order.append(len(toks))
            slow = 50.0 if 3 <= len(self.order) <= 8 else 0.0  # after the 3 warm-ups: the first 6 timed passes
            self.now += (len(toks) + slow) / 1000.0

    m = Clockwork()
    import engine.costmodel as cm

    monkeypatch.setattr(cm.time, "perf_counter", lambda: m.now)
    pts = measure(m, sizes=(1, 4, 16), prefix=8, repeats=5)
    assert m.order == [1, 4, 16] + [1, 4, 16] * 5  # warm-ups, then rounds of every size
    assert pts == pytest.approx({1: 1.0, 4: 4.0, 16: 16.0})
