"""Verifiers (engine/verify.py) and sampling helpers (engine/sampling.py).

The backbone is distributional: a toy language model over V = 5 tokens whose target p(.|prefix) and
drafter q(.|prefix) are fixed random functions of the prefix (each with one zero token, never the
same one, so q > 0 where p = 0 and the reverse). A mini decode loop drafts a tree from q, verifies
it, appends path + bonus and repeats until 3 tokens are out; the empirical law of those 3 tokens
must match the exact product of p's conditionals (chi-square, p-value > 1e-3), and a deliberately
wrong verifier must fail the same test, so each test is known to have power. ERSD is checked token
for token against autoregressive race sampling with the same seed.
"""

from __future__ import annotations

import itertools
from collections import Counter
from functools import lru_cache

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from engine.sampling import (
    draft_sample,
    probs_from_logits,
    race_noise,
    race_topk,
    race_winner,
    sample,
)
from engine.tree import TokenTree, static_tree_layout
from engine.verify import (
    accept,
    sample_next,
    verify_greedy,
    verify_membership,
    verify_mss,
    verify_race,
    verify_rejection,
)

V = 5  # toy vocabulary
N_OUT = 3  # tokens whose joint law is tested
P_PASS = 1e-3  # a correct verifier's chi-square p-value must exceed this ...
P_FAIL = 1e-6  # ... and a wrong one's must fall below this
N_TRIALS = 20_000


# ---- the toy language model ---------------------------------------------------------------------
@lru_cache(maxsize=None)
def _zero_tokens(prefix: tuple[int, ...]) -> tuple[int, int]:
    rng = np.random.default_rng([7, len(prefix), *prefix])
    z_p = int(rng.integers(V))
    return z_p, (z_p + 1 + int(rng.integers(V - 1))) % V  # q's zero differs from p's


@lru_cache(maxsize=None)
def _dist64(salt: int, prefix: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([salt, len(prefix), *prefix])
    w = rng.dirichlet(np.full(V, 0.7))
    w[_zero_tokens(prefix)[salt - 1]] = 0.0
    return w / w.sum()


@lru_cache(maxsize=None)
def target(prefix: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(_dist64(1, prefix), dtype=torch.float32)


@lru_cache(maxsize=None)
def draft(prefix: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(_dist64(2, prefix), dtype=torch.float32)


def exact_prob(seq: tuple[int, ...]) -> float:
    return float(np.prod([_dist64(1, seq[:i])[t] for i, t in enumerate(seq)]))


def chi2_pvalue(counts: Counter) -> float:
    """Chi-square p-value of counts of N_OUT-token prefixes against the exact target law; cells
    expected below 5 are pooled, and an impossible sequence gives 0."""
    n = sum(counts.values())
    probs = {s: exact_prob(s) for s in itertools.product(range(V), repeat=N_OUT)}
    if any(probs[s] == 0.0 for s in counts):
        return 0.0
    big = [s for s in probs if n * probs[s] >= 5]
    small = [s for s in probs if 0 < n * probs[s] < 5]
    obs = [counts[s] for s in big]
    exp = [n * probs[s] for s in big]
    if small:
        obs.append(sum(counts[s] for s in small))
        exp.append(n * sum(probs[s] for s in small))
    exp_arr = np.asarray(exp)
    return float(chisquare(obs, exp_arr * (n / exp_arr.sum())).pvalue)


# ---- drafting and the decode loop -----------------------------------------------------------------
@lru_cache(maxsize=None)
def _layout(shape: tuple[int, ...]) -> tuple[list[int], list[list[int]]]:
    parents = static_tree_layout(shape)
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        children[p + 1].append(i)
    return parents, children


def draft_tree(prefix, shape, kind, gen=None, noise_at_depth=None):
    """A full static-shape tree drafted from q after ``prefix``, and the target's rows for it.

    kind: "iid" / "without_replacement" (sampled from q), "topk" (deterministic top-k of q),
    "race" (first arrivals under q with the position's noise), "garbage" (uniform random tokens),
    "topk_as_iid" (top-k of q mislabelled as an i.i.d. draft from q: a bug the tests must catch).
    """
    parents, children = _layout(tuple(shape))
    tokens = [0] * len(parents)
    prefixes = [prefix] + [()] * len(parents)
    depth = [0] + [0] * len(parents)
    q_rows = [torch.zeros(V)] * (len(parents) + 1)
    for row, kids in enumerate(children):
        if not kids:
            continue
        q = draft(prefixes[row])
        if kind in ("iid", "without_replacement"):
            toks = draft_sample(q, len(kids), gen, without_replacement=kind == "without_replacement")
            q_rows[row] = q
        elif kind in ("topk", "topk_as_iid"):
            toks = q.topk(len(kids)).indices.tolist()
            q_rows[row] = q
        elif kind == "race":
            toks = race_topk(q, noise_at_depth(depth[row]), len(kids))
        else:
            toks = torch.randint(V, (len(kids),), generator=gen).tolist()
        assert len(toks) == len(kids)
        for c, t in zip(kids, toks):
            tokens[c] = t
            prefixes[c + 1] = prefixes[row] + (t,)
            depth[c + 1] = depth[row] + 1
    sampled = kind in ("iid", "without_replacement", "topk_as_iid")
    sampling = {"topk_as_iid": "iid", "race": "race", "topk": "deterministic", "garbage": "deterministic"}.get(kind, kind)
    tree = TokenTree(tokens, list(parents), torch.stack(q_rows) if sampled else None, sampling)
    return tree, torch.stack([target(p) for p in prefixes])


def decode_counts(n_trials, shape, kind, verify, seed):
    """Counts of the first N_OUT emitted tokens over n_trials runs of draft -> verify -> append.
    Also returns the mean accepted path length, to show the tests exercise acceptance."""
    gen = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    accepted, steps = 0, 0
    for _ in range(n_trials):
        out: tuple[int, ...] = ()
        while len(out) < N_OUT:
            tree, target_probs = draft_tree(out, shape, kind, gen)
            path, bonus = verify(tree, target_probs, gen)
            out = out + tuple(tree.path_tokens(path)) + (bonus,)
            accepted, steps = accepted + len(path), steps + 1
        counts[out[:N_OUT]] += 1
    return counts, accepted / steps


def _rs(tree, target_probs, gen):
    return verify_rejection(tree, target_probs, tree.draft_probs, gen)


def _mss(tree, target_probs, gen):
    return verify_mss(tree, target_probs, tree.draft_probs, gen)


def _membership(tree, target_probs, gen):
    return verify_membership(tree, target_probs, gen, greedy=False)


def _accept_everything(tree, target_probs, gen):
    """WRONG on purpose: take the first child down to a leaf, then sample the bonus from p."""
    children = tree.children_table()
    path, row = [], 0
    while children[row]:
        path.append(children[row][0])
        row = path[-1] + 1
    return path, sample(target_probs[row], gen)


def _rs_resampling_from_p(tree, target_probs, gen):
    """WRONG on purpose: rejection sampling that resamples from p instead of the residual."""
    for i, x in enumerate(tree.tokens):
        p, q = target_probs[i], tree.draft_probs[i]
        if float(torch.rand((), generator=gen)) * float(q[x]) >= float(p[x]):
            return list(range(i)), sample(p, gen)
    return list(range(len(tree))), sample(target_probs[len(tree)], gen)


def _mss_ignoring_replacement(tree, target_probs, gen):
    """WRONG on purpose: the i.i.d. residual rule on a tree drawn without replacement."""
    return _mss(TokenTree(tree.tokens, tree.parents, tree.draft_probs, "iid"), target_probs, gen)


DISTRIBUTION_CASES = [
    # id, verifier, drafting kind, shape
    ("rs-chain3", _rs, "iid", (1, 1, 1)),
    ("mss-iid-2x2", _mss, "iid", (2, 2)),
    ("mss-iid-3x1", _mss, "iid", (3, 1)),
    ("mss-wor-2x2", _mss, "without_replacement", (2, 2)),
    ("mss-wor-3x1", _mss, "without_replacement", (3, 1)),
    ("membership-topk-2x2", _membership, "topk", (2, 2)),
    ("membership-topk-3x1", _membership, "topk", (3, 1)),
    ("membership-iid-2x2", _membership, "iid", (2, 2)),
]


@pytest.mark.parametrize("verify,kind,shape", [c[1:] for c in DISTRIBUTION_CASES], ids=[c[0] for c in DISTRIBUTION_CASES])
def test_verifier_output_has_target_distribution(verify, kind, shape):
    counts, mean_accepted = decode_counts(N_TRIALS, shape, kind, verify, seed=1234)
    pvalue = chi2_pvalue(counts)
    assert pvalue > P_PASS, f"output law differs from the target's: chi-square p = {pvalue:.2e}"
    assert mean_accepted > 0.25, f"drafts are almost never accepted ({mean_accepted:.2f}/step): the test would be vacuous"


WRONG_CASES = [
    ("accept-everything-chain3", _accept_everything, "iid", (1, 1, 1), 2_000),
    ("accept-everything-topk-2x2", _accept_everything, "topk", (2, 2), 2_000),
    ("rs-resampling-from-p-chain3", _rs_resampling_from_p, "iid", (1, 1, 1), 3_000),
    ("iid-rule-on-wor-tree-3x1", _mss_ignoring_replacement, "without_replacement", (3, 1), 3_000),
    ("mss-on-topk-tree-2x2", _mss, "topk_as_iid", (2, 2), 3_000),
]


@pytest.mark.parametrize("verify,kind,shape,n", [c[1:] for c in WRONG_CASES], ids=[c[0] for c in WRONG_CASES])
def test_distribution_test_catches_wrong_verifier(verify, kind, shape, n):
    counts, _ = decode_counts(n, shape, kind, verify, seed=1234)
    pvalue = chi2_pvalue(counts)
    assert pvalue < P_FAIL, f"the chi-square test did not catch a wrong verifier (p = {pvalue:.2e})"


# ---- exponential races / ERSD ---------------------------------------------------------------------
def ar_race(seed: int, n: int, same_noise_everywhere: bool = False) -> tuple[int, ...]:
    """Plain autoregressive race sampling: token at position i = race winner of p with noise (seed, i)."""
    out: tuple[int, ...] = ()
    for pos in range(n):
        out += (race_winner(target(out), race_noise(seed, 0 if same_noise_everywhere else pos, V)),)
    return out


def test_ar_race_sampling_has_target_distribution():
    counts = Counter(ar_race(seed, N_OUT) for seed in range(N_TRIALS))
    assert chi2_pvalue(counts) > P_PASS
    # power: reusing one noise vector for every position correlates the tokens
    wrong = Counter(ar_race(seed, N_OUT, same_noise_everywhere=True) for seed in range(N_TRIALS))
    assert chi2_pvalue(wrong) < P_FAIL


def ersd(seed: int, n: int, shape, kind: str, gen=None):
    """ERSD decode loop; returns the first n tokens and how many drafted tokens were accepted."""
    out: tuple[int, ...] = ()
    accepted = 0
    while len(out) < n:
        base = len(out)

        def noise_at_depth(d, base=base):
            return race_noise(seed, base + d, V)

        tree, target_probs = draft_tree(out, shape, kind, gen, noise_at_depth)
        path, bonus = verify_race(tree, target_probs, noise_at_depth)
        out = out + tuple(tree.path_tokens(path)) + (bonus,)
        accepted += len(path)
    return out[:n], accepted


@pytest.mark.parametrize("kind", ["race", "garbage"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 2, 1)], ids=["chain4", "tree3x2x1"])
def test_ersd_emits_exactly_the_ar_race_tokens(shape, kind):
    gen = torch.Generator().manual_seed(5)
    n_tokens, total_accepted = 12, 0
    for seed in range(150):
        tokens, accepted = ersd(seed, n_tokens, shape, kind, gen)
        assert tokens == ar_race(seed, n_tokens), f"seed {seed}"
        total_accepted += accepted
    if kind == "race":  # the identity must hold on accepted paths too, not only at rejections
        assert total_accepted > 0.3 * 150 * n_tokens / 2


def test_race_noise_is_a_pure_function_of_seed_and_position():
    a = race_noise(3, 17, 49152)
    a_copy = a.clone()
    a.zero_()  # callers get a copy: mutating it must not poison the cache
    assert torch.equal(race_noise(3, 17, 49152), a_copy)
    for pos in range(100):  # evict (3, 17) from the LRU cache
        race_noise(99, pos, 49152)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        b = race_noise(3, 17, 49152)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(race_noise(3, 17, 49152), a_copy)
    assert torch.equal(b, a_copy)
    assert not torch.equal(race_noise(3, 18, 49152), a_copy)
    assert not torch.equal(race_noise(4, 17, 49152), a_copy)
    assert a_copy.dtype == torch.float32 and bool((a_copy >= 0).all())
    assert abs(a_copy.mean().item() - 1.0) < 0.02  # Exp(1)


def test_race_winner_and_topk():
    q = torch.tensor([0.1, 0.0, 0.4, 0.2, 0.3])
    noise = torch.tensor([0.05, 0.0, 0.5, 0.1, 0.9])
    # arrivals: 0.5, never, 1.25, 0.5(=0.1/0.2), 3.0; a zero-probability token never wins, even with zero noise
    assert race_winner(q, noise) in (0, 3)
    assert race_topk(q, noise, 4)[2:] == [2, 4]
    assert race_topk(q, noise, 10) == race_topk(q, noise, 4)  # capped at the support
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        probs = torch.softmax(torch.randn(50, generator=gen), -1)
        noise = torch.empty(50).exponential_(generator=gen)
        top = race_topk(probs, noise, 5)
        assert top[0] == race_winner(probs, noise)
        assert top == (noise / probs).argsort()[:5].tolist()


# ---- greedy -----------------------------------------------------------------------------------------
def _random_tree_and_logits(gen: torch.Generator, n_nodes: int, vocab: int = 8):
    """Random tree with distinct sibling tokens; a child copies its parent row's argmax half the time."""
    logits = torch.randn(n_nodes + 1, vocab, generator=gen)
    best = logits.argmax(-1).tolist()
    parents, tokens = [], []
    used: dict[int, set[int]] = {}
    for i in range(n_nodes):
        p = int(torch.randint(-1, i, (), generator=gen)) if i else -1
        taken = used.setdefault(p, set())
        free = [t for t in range(vocab) if t not in taken]
        if not free:
            p, taken, free = -1, used[-1], [t for t in range(vocab) if t not in used[-1]]
        if best[p + 1] in free and float(torch.rand((), generator=gen)) < 0.5:
            t = best[p + 1]
        else:
            t = free[int(torch.randint(len(free), (), generator=gen))]
        taken.add(t)
        parents.append(p)
        tokens.append(t)
    return TokenTree(tokens, parents), logits


def _reference_greedy(tree: TokenTree, logits: torch.Tensor):
    """The deepest node whose every token equals the argmax at the row before it."""
    best = [int(row.argmax()) for row in logits]
    deepest: list[int] = []
    for i in range(len(tree)):
        path = tree.path_to(i)
        rows = [0] + [n + 1 for n in path[:-1]]
        if all(tree.tokens[n] == best[r] for n, r in zip(path, rows)) and len(path) > len(deepest):
            deepest = path
    return deepest, best[deepest[-1] + 1 if deepest else 0]


def test_greedy_matches_an_explicit_argmax_walk():
    gen = torch.Generator().manual_seed(11)
    for trial in range(300):
        tree, logits = _random_tree_and_logits(gen, n_nodes=trial % 25)
        expected = _reference_greedy(tree, logits)
        assert verify_greedy(tree, logits) == expected
        assert verify_greedy(tree, torch.softmax(logits, -1)) == expected
        assert verify_membership(tree, logits, None, greedy=True) == expected
        for method in ("greedy", "rs", "mss", "membership", "race"):  # T = 0: every rule is greedy
            assert accept(tree, logits, method=method, temperature=0.0) == expected


def test_tree_containing_the_greedy_path_accepts_it_fully():
    def logits_at(prefix):
        return torch.tensor(np.random.default_rng([3, len(prefix), *prefix]).normal(size=V), dtype=torch.float32)

    # greedy continuation of length 4
    greedy: list[int] = []
    for _ in range(4):
        greedy.append(int(logits_at(tuple(greedy)).argmax()))
    # distractors hang off every greedy node with other tokens, interleaved in packed order
    tokens, parents, prefixes, chain = [], [], [()], []
    for depth, g in enumerate(greedy):
        parent = chain[-1] if chain else -1
        for t in range(V):
            if t != g:
                tokens.append(t)
                parents.append(parent)
                prefixes.append(tuple(greedy[:depth]) + (t,))
        tokens.append(g)
        parents.append(parent)
        prefixes.append(tuple(greedy[: depth + 1]))
        chain.append(len(tokens) - 1)
    tree = TokenTree(tokens, parents)
    logits = torch.stack([logits_at(p) for p in prefixes])
    path, bonus = verify_greedy(tree, logits)
    assert path == chain
    assert bonus == int(logits_at(tuple(greedy)).argmax())


# ---- dispatcher, plain sampling, validation -------------------------------------------------------
@pytest.mark.parametrize("method", ["rs", "mss", "membership", "race"])
def test_accept_equals_the_verifier_on_full_probabilities(method):
    shape = (1, 1, 1) if method == "rs" else (2, 2)
    for seed in range(20):
        tree, _ = draft_tree((seed % V,), shape, "iid", torch.Generator().manual_seed(seed))
        logits = torch.randn(len(tree) + 1, V, generator=torch.Generator().manual_seed(100 + seed)) * 2
        target_probs = probs_from_logits(logits, 0.8, 0.9)

        def noise(d, seed=seed):
            return race_noise(seed, d, V)

        got = accept(tree, logits, method=method, temperature=0.8, top_p=0.9,
                     generator=torch.Generator().manual_seed(seed), noise_at_depth=noise)
        gen = torch.Generator().manual_seed(seed)
        direct = {
            "rs": lambda: verify_rejection(tree, target_probs, tree.draft_probs, gen),
            "mss": lambda: verify_mss(tree, target_probs, tree.draft_probs, gen),
            "membership": lambda: verify_membership(tree, target_probs, gen, greedy=False),
            "race": lambda: verify_race(tree, target_probs, noise),
        }[method]()
        assert got == direct


def test_empty_tree_emits_one_target_token():
    probs = target(()).unsqueeze(0)
    empty = TokenTree([], [], torch.zeros(1, V), "iid")
    for verify in (_rs, _mss, _membership):
        path, bonus = verify(empty, probs, torch.Generator().manual_seed(0))
        assert path == [] and probs[0, bonus] > 0
    assert verify_race(empty, probs, lambda d: race_noise(0, d, V)) == ([], race_winner(probs[0], race_noise(0, 0, V)))
    assert verify_greedy(empty, probs) == ([], int(probs[0].argmax()))
    # TokenTree.empty() is "deterministic" with no q: q-based rules still take it (nothing to reject)
    for method in ("rs", "mss", "membership"):
        path, bonus = accept(TokenTree.empty(), probs.log(), method=method, temperature=1.0,
                             generator=torch.Generator().manual_seed(0))
        assert path == [] and probs[0, bonus] > 0


def test_verifiers_refuse_what_they_cannot_verify():
    gen = torch.Generator().manual_seed(0)
    tree, probs = draft_tree((), (2, 1), "iid", gen)
    with pytest.raises(ValueError, match="chain"):
        verify_rejection(tree, probs, tree.draft_probs, gen)
    topk, probs = draft_tree((), (2, 1), "topk")
    with pytest.raises(ValueError, match="membership"):
        verify_mss(topk, probs, topk.draft_probs, gen)
    with pytest.raises(ValueError, match="rows"):
        verify_membership(tree, probs[:-1], gen, greedy=False)
    with pytest.raises(ValueError, match="unknown verifier"):
        accept(tree, probs.log(), method="nope", temperature=1.0)
    with pytest.raises(ValueError, match="noise_at_depth"):
        accept(tree, probs.log(), method="race", temperature=1.0)
    with pytest.raises(ValueError, match="temperature 0"):
        accept(tree, probs.log(), method="greedy", temperature=1.0)


def test_sample_next():
    logits = torch.tensor([0.0, 3.0, 1.0, -1.0])
    assert sample_next(logits, 0.0) == 1
    noise = torch.tensor([0.9, 0.8, 0.01, 0.5])
    assert sample_next(logits, 1.0, noise=noise) == race_winner(probs_from_logits(logits, 1.0), noise)
    a = sample_next(logits, 1.0, generator=torch.Generator().manual_seed(3))
    b = sample(probs_from_logits(logits, 1.0), torch.Generator().manual_seed(3))
    assert a == b


def test_draft_sample():
    gen = torch.Generator().manual_seed(0)
    q = torch.tensor([0.5, 0.0, 0.3, 0.2])
    for _ in range(20):
        toks = draft_sample(q, 3, gen, without_replacement=True)
        assert sorted(toks) == [0, 2, 3]
    assert len(draft_sample(q, 5, gen, without_replacement=True)) == 3  # capped at the support
    assert all(t != 1 for t in draft_sample(q, 50, gen, without_replacement=False))


# ---- top-p --------------------------------------------------------------------------------------
def test_probs_from_logits_top_p_truncates_exactly():
    p = torch.tensor([0.125, 0.5, 0.0625, 0.25, 0.0625])
    logits = p.log() * 2.0  # temperature 2 undoes the doubling
    full = probs_from_logits(logits, 2.0)
    torch.testing.assert_close(full, p, atol=1e-6, rtol=0)
    cases = {  # top_p -> tokens kept: the fewest most likely tokens whose mass reaches top_p
        0.3: [0, 1, 0, 0, 0],  # 0.5 alone
        0.5: [0, 1, 0, 0, 0],
        0.6: [0, 1, 0, 1, 0],  # 0.75
        0.8: [1, 1, 0, 1, 0],  # 0.875
        0.9: [1, 1, 1, 1, 0],  # 0.9375: of the tied 0.0625s the lower token id is kept
    }
    for top_p, keep in cases.items():
        keep_t = torch.tensor(keep, dtype=torch.bool)
        got = probs_from_logits(logits, 2.0, top_p)
        assert torch.equal(got > 0, keep_t), (top_p, got)
        torch.testing.assert_close(got, torch.where(keep_t, p, 0.0) / p[keep_t].sum(), atol=1e-6, rtol=0)
    # rows are independent; top_p = 1 is a plain softmax; bf16 logits give float32 probabilities
    batch = torch.stack([logits, logits.flip(0)])
    assert torch.equal(probs_from_logits(batch, 2.0, 0.6)[1], probs_from_logits(logits.flip(0), 2.0, 0.6))
    torch.testing.assert_close(probs_from_logits(batch, 1.5), torch.softmax(batch / 1.5, -1))
    half = probs_from_logits(logits.to(torch.bfloat16), 2.0, 0.6)
    assert half.dtype == torch.float32 and torch.equal(half > 0, torch.tensor(cases[0.6], dtype=torch.bool))
    with pytest.raises(ValueError):
        probs_from_logits(logits, 0.0)


@pytest.mark.parametrize("V", [49152, 1000, 257, 256, 7])
def test_nucleus_from_the_top_k_is_the_sort_bit_for_bit(V):
    """sampling.nucleus (the top-k values first; the sort only where a cut falls past them) gives
    nucleus_by_sort's bits: peaked and flat rows, exact ties at the top and across the cut, batches
    where some rows fall back."""
    from engine.sampling import NUCLEUS_TOPK, nucleus, nucleus_by_sort

    g = torch.Generator().manual_seed(V)
    paths: dict = {}
    for trial in range(60):
        B = 1 + trial % 4
        logits = torch.randn(B, V, generator=g) * [0.5, 2.0, 5.0, 12.0][trial % 4]
        if trial % 3 == 0:
            logits = (logits * 2).round() / 2  # many exact ties
        if trial % 5 == 0:
            logits[:, : min(40, V)] = logits[:, :1]  # ties at the top
        probs = torch.softmax(logits, -1)
        for top_p in (0.05, 0.5, 0.9, 0.95, 0.999):
            assert torch.equal(nucleus(probs, top_p), nucleus_by_sort(probs, top_p)), (trial, top_p)
            level = next((m for m in NUCLEUS_TOPK if (lambda v: bool(((v.cumsum(-1) - v)[:, -1] >= top_p).all()))(
                probs.topk(min(m, V), -1).values)), None)
            paths[level] = paths.get(level, 0) + 1
    assert torch.equal(nucleus(probs[0], 0.9), nucleus_by_sort(probs[0], 0.9))  # one row, no batch dim
    # every path was taken: the 64 largest values, the 256 largest, the sort
    assert paths.get(NUCLEUS_TOPK[0], 0) > 30, paths
    assert V <= NUCLEUS_TOPK[0] or paths.get(NUCLEUS_TOPK[1], 0) > 3, paths
    assert V <= NUCLEUS_TOPK[-1] or paths.get(None, 0) > 10, paths


def test_draw_rows_samples_the_nucleus(monkeypatch):
    """sampling.draw_rows draws each row's token from its top-p nucleus with the nucleus's
    probabilities: among the top candidates where every row's nucleus lies there, over the whole
    vocabulary otherwise (DRAW_TOPK made small to take both), and from the softmax at top_p = 1."""
    from engine import sampling

    g = torch.Generator().manual_seed(11)
    probs = torch.softmax(torch.randn(3, 40, generator=g) * 2.0, -1)
    probs[2] = torch.softmax(torch.randn(40, generator=g) * 0.1, -1)  # flat: its nucleus is wide
    gen = torch.Generator().manual_seed(5)
    n = 6000
    for topk, top_p, rows in ((8, 0.6, slice(0, 2)), (8, 0.9, slice(0, 3)), (40, 1.0, slice(0, 3))):
        monkeypatch.setattr(sampling, "DRAW_TOPK", topk)
        p = probs[rows]
        want = sampling.nucleus(p, top_p) if top_p < 1 else p
        counts = torch.zeros_like(p)
        for _ in range(n):
            t = sampling.draw_rows(p, top_p, gen)
            counts[torch.arange(len(t)), t] += 1
        assert bool((counts[want == 0] == 0).all())  # nothing outside the nucleus
        # every token's frequency within 5 standard deviations of its probability
        sd = (want * (1 - want) / n).sqrt()
        assert bool(((counts / n - want).abs() <= 5 * sd + 1e-9).all()), (topk, top_p)


def test_argmax_rows_is_torch_argmax():
    """verify.argmax_rows (numpy's argmax for CPU fp32, torch's otherwise) picks what torch's does:
    the first maximum on ties, a NaN as the maximum, rows of a 2-D tensor, strided and inference
    tensors."""
    from engine.verify import argmax_rows

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 1000, generator=g)
    x[1, 5] = x[1, 9] = 50.0  # a tie: the first
    x[2, 7] = float("nan")
    x[3, 3] = x[3, 4] = float("nan")
    x[4] = 0.0
    for t in (x, x[:, ::3], x.t().contiguous().t()):
        assert argmax_rows(t) == t.argmax(dim=-1).tolist()
        assert [argmax_rows(r) for r in t] == [int(r.argmax()) for r in t]
    with torch.inference_mode():
        y = torch.randn(3, 50, generator=g)
        assert argmax_rows(y) == y.argmax(dim=-1).tolist()
    b = x.to(torch.bfloat16)  # torch's own path
    assert argmax_rows(b) == b.argmax(dim=-1).tolist() and isinstance(argmax_rows(b[0]), int)
