"""Session 47: sampling.sample and draft_sample draw by inverting the distribution function (one
uniform a draw; torch.multinomial's one draw raced an exponential per entry: ~0.9 ms a 49k row).
Oracles: the distributions themselves (chi-square), the sequential without-replacement law
q(a) q(b) / (1 - q(a)), and torch.multinomial's refusals."""

from __future__ import annotations

import itertools

import pytest
import torch

from engine.sampling import draft_sample, sample

from .lossless_util import _chisquare


def _law():
    p = torch.tensor([0.0, 0.3, 0.0, 0.05, 0.25, 0.0, 0.1, 0.3, 1e-9, 0.0])
    return p / p.sum()


def test_sample_follows_the_distribution_and_never_draws_a_zero():
    p, g = _law(), torch.Generator().manual_seed(1)
    n = 20_000
    counts = torch.bincount(torch.tensor([sample(p * 7.0, g) for _ in range(n)]), minlength=len(p))  # unnormalised
    assert int(counts[p == 0].sum()) == 0
    assert _chisquare(counts.tolist(), p.tolist()) > 1e-4
    # zero entries at both ends, and a token whose running sum is the whole mass
    q = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0])
    assert {sample(q, g) for _ in range(200)} == {2}


def test_draws_follow_the_generator_and_the_big_vocabulary():
    p = torch.softmax(torch.randn(49152, generator=torch.Generator().manual_seed(2)) * 4, -1)
    a = [sample(p, torch.Generator().manual_seed(s)) for s in range(50)]
    assert a == [sample(p, torch.Generator().manual_seed(s)) for s in range(50)]  # a seed's draw is the same
    assert len(set(a)) > 5 and all(0 <= t < 49152 for t in a)


@pytest.mark.parametrize("bad", [torch.zeros(6), torch.tensor([0.5, float("nan"), 0.5]),
                                 torch.tensor([0.5, float("inf")]), torch.tensor([0.7, -0.1, 0.4])])
def test_no_mass_nan_inf_or_negative_is_refused(bad):
    with pytest.raises(ValueError, match="invalid distribution"):
        sample(bad, torch.Generator().manual_seed(0))
    with pytest.raises((ValueError, RuntimeError)):  # the oracle refuses them too
        torch.multinomial(bad, 1)


def test_without_replacement_is_the_sequential_draw():
    q, g = _law(), torch.Generator().manual_seed(3)
    n = 20_000
    seen = {}
    for _ in range(n):
        a, b = draft_sample(q, 2, g, without_replacement=True)
        assert a != b and q[a] > 0 and q[b] > 0
        seen[(a, b)] = seen.get((a, b), 0) + 1
    support = [i for i in range(len(q)) if q[i] > 0]
    pairs = [(a, b) for a, b in itertools.permutations(support, 2)]
    law = [float(q[a] * q[b] / (1 - q[a])) for a, b in pairs]
    assert _chisquare([seen.get(pr, 0) for pr in pairs], law) > 1e-4
    assert sorted(draft_sample(q, 10, g, without_replacement=True)) == [1, 3, 4, 6, 7, 8]  # only its support


def test_with_replacement_is_iid():
    q, g = _law(), torch.Generator().manual_seed(4)
    draws = [draft_sample(q, 3, g, without_replacement=False) for _ in range(8_000)]
    assert all(len(d) == 3 for d in draws)
    counts = torch.bincount(torch.tensor([t for d in draws for t in d]), minlength=len(q))
    assert _chisquare(counts.tolist(), q.tolist()) > 1e-4
    same = sum(d[0] == d[1] for d in draws) / len(draws)  # repeats as often as i.i.d. draws repeat
    assert abs(same - float((q * q).sum())) < 0.03


def test_a_uniform_that_rounds_up_to_the_total_draws_the_last_entry_with_mass(monkeypatch):
    """u * total may round to the total (u = 1 - 2**-53): the draw is then the last token with mass,
    never a zero-probability token after it."""
    from engine import sampling

    real = torch.rand

    def top(*a, **k):
        return torch.full_like(real(*a, **k), 1.0)  # u * total == total exactly: the worst case

    monkeypatch.setattr(sampling.torch, "rand", top)
    p = torch.tensor([0.2, 0.5, 0.3, 0.0, 0.0])
    assert sample(p, None) == 2
    assert sampling.draw_rows(torch.stack([p, p.flip(0)]), 1.0, None).tolist() == [2, 4]
