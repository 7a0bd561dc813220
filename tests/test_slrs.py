"""SLRS (heterogeneous-vocab Alg. 3) on toy vocabularies with p and q given exactly: ψ against a
brute-force enumeration of the procedure, Alg. 3's output distribution against p, the
Lemma 3.1 refusal, and the greedy rule."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from engine.slrs import Procedure, PsiTooLarge, TargetTrie, residual_sample, slrs_accept


def procedure(target: list[str], draft: list[str], lookahead: int, max_terms: int = 4096, eos: bool = False) -> Procedure:
    """Target ids are positions in ``target``; drafter ids positions in ``draft`` (+ EOS last if ``eos``)."""
    trie = TargetTrie({i: s.encode() for i, s in enumerate(target)})
    draft_bytes = [s.encode() for s in draft] + ([None] if eos else [])
    return Procedure(trie, draft_bytes, draft_eos=len(draft) if eos else None, target_eos=len(target) if eos else None,
                     lookahead=lookahead, max_terms=max_terms)


def q_markov(draft: list[str], eos: bool, seed: int):
    """A context-dependent drafter: q depends on the last draft token (exact, seeded)."""
    D = len(draft) + (1 if eos else 0)
    g = torch.Generator().manual_seed(seed)
    table = torch.softmax(torch.randn(D + 1, D, generator=g) * 1.5, -1)  # row D: at the start

    def q(prefix: tuple[int, ...]) -> torch.Tensor:
        return table[prefix[-1] if prefix else D]

    return q


def brute_force_psi(proc: Procedure, q, D: int) -> dict:
    """Every draft sequence up to the lookahead, run through the procedure: the exact law of t1."""
    law: dict = {}
    for n in range(1, proc.lookahead + 1):
        for seq in itertools.product(range(D), repeat=n):
            t, used, _ = proc.run(seq)
            if used != n or t == -2:
                continue  # stopped earlier (counted at its own length) or not yet stopped
            w = 1.0
            for j in range(n):
                w *= float(q(seq[:j])[seq[j]])
            law[t] = law.get(t, 0.0) + w
    return law


CASES = {
    # the paper's example (§4 / Table 4): T = {a, b}, D = {a, b, aa}
    "paper": (["a", "b"], ["a", "b", "aa"], 3, False),
    # longer target tokens than draft tokens, with an end of sequence
    "longer-target": (["a", "b", "ab", "ba", "aab", "bb"], ["a", "b"], 4, True),
    # multi-character draft tokens straddling target tokens
    "straddle": (["a", "b", "ab", "aba"], ["a", "b", "ab", "ba", "aa"], 3, True),
}


@pytest.mark.parametrize("case", CASES)
def test_psi_is_the_exact_law_of_the_procedure(case):
    target, draft, look, eos = CASES[case]
    proc = procedure(target, draft, look, eos=eos)
    q = q_markov(draft, eos, seed=1)
    D = len(draft) + (1 if eos else 0)
    law = brute_force_psi(proc, q, D)
    batch = lambda prefixes: torch.stack([q(p) for p in prefixes])  # noqa: E731
    for t in list(range(len(target))) + ([len(target)] if eos else []):
        assert proc.psi(t, batch) == pytest.approx(law.get(t, 0.0), abs=1e-9), (case, t)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-6)  # every draw sequence stops (∅ included)


def test_paper_example_psi_by_hand():
    # q i.i.d.: q(a) = .5, q(b) = .2, q(aa) = .3; any first draft decides t1: 'a' and 'aa' give a
    proc = procedure(["a", "b"], ["a", "b", "aa"], lookahead=3)
    q = torch.tensor([0.5, 0.2, 0.3])
    batch = lambda prefixes: q.expand(len(prefixes), 3)  # noqa: E731
    assert proc.psi(0, batch) == pytest.approx(0.8)
    assert proc.psi(1, batch) == pytest.approx(0.2)


def _draw_procedure(proc: Procedure, q, g: torch.Generator) -> int | None:
    seq: list[int] = []
    while True:
        seq.append(int(torch.multinomial(q(tuple(seq)), 1, generator=g)))
        t, used, _ = proc.run(seq)
        if t != -2:
            return t


@pytest.mark.parametrize("case", CASES)
def test_alg3_outputs_are_distributed_as_p(case):
    target, draft, look, eos = CASES[case]
    proc = procedure(target, draft, look, eos=eos)
    q = q_markov(draft, eos, seed=2)
    batch = lambda prefixes: torch.stack([q(p) for p in prefixes])  # noqa: E731
    V = len(target) + (1 if eos else 0)
    p = torch.softmax(torch.randn(V, generator=torch.Generator().manual_seed(7)) * 1.2, -1)
    cache: dict = {}
    psi = lambda i, t: cache.setdefault(t, proc.psi(t, batch))  # noqa: E731
    g = torch.Generator().manual_seed(0)
    n = 6000
    counts = torch.zeros(V)
    accepted = 0
    for _ in range(n):
        t1 = _draw_procedure(proc, q, g)
        path, nxt = slrs_accept([t1], [p], psi, g, greedy=False)
        out = t1 if path else nxt
        accepted += bool(path)
        counts[out] += 1
    expected = (p.double() / p.double().sum() * n).tolist()
    assert chisquare(counts.double().tolist(), expected).pvalue > 1e-3
    # acceptance is Σ_t min(p(t), ψ(t)) (Table 3)
    rate = sum(min(float(p[t]), psi(0, t)) for t in range(V))
    assert accepted / n == pytest.approx(rate, abs=4 * (rate * (1 - rate) / n) ** 0.5 + 1e-3)


def test_the_distribution_test_has_power():
    """ψ taken as the first draw's q alone (ignoring that 'aa' also proposes 'a') is detected."""
    proc = procedure(["a", "b"], ["a", "b", "aa"], lookahead=3)
    q = torch.tensor([0.5, 0.2, 0.3])
    p = torch.tensor([0.75, 0.25])
    g = torch.Generator().manual_seed(0)
    n = 6000
    counts = torch.zeros(2)
    for _ in range(n):
        t1 = _draw_procedure(proc, lambda prefix: q, g)
        path, nxt = slrs_accept([t1], [p], lambda i, t: float(q[t]), g, greedy=False)
        counts[t1 if path else nxt] += 1
    assert chisquare(counts.double().tolist(), (p.double() * n).tolist()).pvalue < 1e-3


def test_greedy_slrs_is_exact_match():
    p = [torch.tensor([0.1, 0.9]), torch.tensor([0.8, 0.2])]
    assert slrs_accept([1, 0], p, lambda i, t: 1.0, None, greedy=True) == ([0, 1], None)
    assert slrs_accept([1, 1], p, lambda i, t: 1.0, None, greedy=True) == ([0], 0)
    assert slrs_accept([None], p, lambda i, t: 1.0, None, greedy=True) == ([], 1)


def test_residual_sampling_is_exact():
    p = torch.tensor([0.5, 0.3, 0.2])
    psi = {0: 0.7, 1: 0.1, 2: 0.0}
    want = (p - torch.minimum(p, torch.tensor([0.7, 0.1, 0.0])))
    want = want / want.sum()
    g = torch.Generator().manual_seed(0)
    n = 6000
    counts = torch.zeros(3)
    for _ in range(n):
        counts[residual_sample(p, psi.__getitem__, g)] += 1
    assert counts[0] == 0
    w = want[1:].double() / want[1:].double().sum()
    assert chisquare(counts[1:].double().tolist(), (w * counts[1:].sum().double()).tolist()).pvalue > 1e-3


def test_psi_refuses_when_the_terms_explode():
    # a complete draft vocabulary of strings up to 3 over {a, b} (Lemma 3.1: 2^(m-1) ways per
    # m-character target token), against a long target token
    draft = ["".join(s) for n in (1, 2, 3) for s in itertools.product("ab", repeat=n)]
    target = ["a", "b", "ab" * 6]
    proc = procedure(target, draft, lookahead=12, max_terms=50)
    q = torch.full((len(draft),), 1.0 / len(draft))
    batch = lambda prefixes: q.expand(len(prefixes), len(draft))  # noqa: E731
    with pytest.raises(PsiTooLarge, match="Lemma 3.1"):
        proc.psi(2, batch)
    assert proc.psi(1, batch) > 0  # short tokens stay cheap
