"""Verification rules (ALGORITHMS.md §2): which drafted nodes the target accepts, and what it emits.

Every verifier returns ``(path, bonus)``: ``path`` the accepted node indices into ``tree.tokens``,
root-most first, and ``bonus`` the token the target emits after them (a correction after a
rejection, or the extra token after a fully accepted branch). The step emits
``tree.path_tokens(path) + [bonus]``.

Rows follow TokenTree (engine/tree.py): ``target_probs[0]`` is the target's distribution at the
root (it predicts the root's children) and ``target_probs[i + 1]`` the one at node i; likewise
``draft_probs`` (``tree.draft_probs``), the distributions the children were drawn from. Verifiers
only index rows by an int, so ``target_probs`` may be a (T + 1, V) tensor or any row-indexable
object (``accept`` passes one that computes a row's softmax on first use). Rows reached by the walk
are at most ``tree.max_depth + 1``; per node the Python work is O(children), vector work O(V).

Each rule is lossless: the emitted tokens are distributed exactly as autoregressive sampling from
the target (tests/test_verify.py checks each one's output distribution by chi-square).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .sampling import probs_from_logits, race_winner, residual, sample
from .tree import TokenTree

METHODS = ("greedy", "rs", "mss", "membership", "race")


# ---- helpers --------------------------------------------------------------------------------------
def _check_rows(tree: TokenTree, rows, name: str) -> None:
    if len(rows) != len(tree) + 1:
        raise ValueError(f"{name} has {len(rows)} rows; a tree of {len(tree)} nodes needs {len(tree) + 1} (root + nodes)")


def _require_draft_probs(tree: TokenTree, draft_probs, method: str) -> None:
    if len(tree) == 0:  # nothing drafted, nothing to reject against: the step is a plain sample
        return
    if draft_probs is None or tree.sampling not in ("iid", "without_replacement"):
        raise ValueError(
            f"--verify {method} needs a tree drawn from q (iid or without replacement); this one is "
            f"{tree.sampling!r}{' without draft_probs' if draft_probs is None else ''}: use membership (or race for ERSD trees)"
        )
    _check_rows(tree, draft_probs, "draft_probs")


def _child_with_token(tree: TokenTree, children: Sequence[int], token: int) -> int | None:
    """First child carrying ``token`` (i.i.d. drafts may repeat a token; taking any copy is lossless)."""
    for c in children:
        if tree.tokens[c] == token:
            return c
    return None


def _accept_draft(target_p: float, draft_q: float, generator: torch.Generator | None) -> bool:
    """u < min(1, p(x)/q(x)) with u ~ U[0, 1) (mamba-drafters Alg. 1 line 10), written u·q < p so
    q = 0 needs no division."""
    device = generator.device if generator is not None else "cpu"
    u = float(torch.rand((), generator=generator, device=device))
    return u * draft_q < target_p


class _RowProbs:
    """target_probs computed per row on first use: the walk reads at most max_depth + 1 of the
    T + 1 rows, and a top-p sort over 49k entries is the expensive part of a row."""

    def __init__(self, logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0, min_p: float = 0.0):
        self._logits, self._temperature = logits, temperature
        self._cuts = {"top_p": top_p, "top_k": top_k, "min_p": min_p}
        self._rows: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self._logits.shape[0]

    def __getitem__(self, row: int) -> torch.Tensor:
        if row not in self._rows:
            self._rows[row] = probs_from_logits(self._logits[row], self._temperature, **self._cuts)
        return self._rows[row]


def argmax_rows(x: torch.Tensor) -> list[int] | int:
    """``x.argmax(-1).tolist()`` (a list for a 2-D ``x``, an int for 1-D): through numpy for CPU
    fp32 (the same first-maximum rule, NaN counted as the maximum in both): torch's CPU argmax
    wakes its OpenMP team, 45 us a 49,152-token row and 410 us for 16 rows under the engine's
    passive waits against numpy's 5 and 53 (2-core Zen 4, 2026-11-27), a share of a ~5 ms step."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and not x.requires_grad and x.dim() > 0:
        a = x.numpy().argmax(-1)
    else:
        a = x.argmax(dim=-1)
    return a.tolist() if x.dim() > 1 else int(a)


# ---- verifiers ------------------------------------------------------------------------------------
def verify_greedy(tree: TokenTree, target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Greedy tree verification at T = 0 (ALGORITHMS.md §2; mamba-drafters Alg. 1 with p one-hot).

    From the root, take argmax of the target at the current row and descend into the child with
    that token; stop at the first row where no child matches and emit its argmax. Works on any tree,
    deterministic drafts included. target_logits: (T + 1, V) logits or probs (same argmax).
    """
    _check_rows(tree, target_logits, "target_logits")
    choice = argmax_rows(target_logits)  # one host sync for the whole tree
    children = tree.children_table()
    path: list[int] = []
    row = 0
    while True:
        child = _child_with_token(tree, children[row], choice[row])
        if child is None:
            return path, choice[row]
        path.append(child)
        row = child + 1


def verify_rejection(
    tree: TokenTree, target_probs: torch.Tensor, draft_probs: torch.Tensor, generator: torch.Generator | None
) -> tuple[list[int], int]:
    """Sequence rejection sampling on a chain (Leviathan et al. 2023; mamba-drafters Alg. 1).

    Node i (drawn from draft_probs[i]) is accepted with probability min(1, p(x)/q(x)); at the first
    rejection emit a sample of norm(max(p - q, 0)) at that row; if all are accepted, sample the
    bonus from p at the last node — unless that row is in ``tree.rejected_rows`` (a draw outside
    the target's vocabulary, union bridge): then it was rejected, and the residual is sampled.
    Refuses non-chains (use ``verify_mss``).
    """
    if tree.parents != list(range(-1, len(tree) - 1)):
        raise ValueError("rejection sampling verifies a chain; use mss or membership for trees")
    _require_draft_probs(tree, draft_probs, "rs")
    _check_rows(tree, target_probs, "target_probs")
    path: list[int] = []
    for i, x in enumerate(tree.tokens):  # node i was drawn from row i (row 0 = root)
        p, q = target_probs[i], draft_probs[i]
        if not _accept_draft(float(p[x]), float(q[x]), generator):
            return path, sample(residual(p, q), generator)
        path.append(i)
    last = len(tree)
    if last in tree.rejected_rows:  # the union bridge's draw outside T: p = 0 there, so rejected
        return path, sample(residual(target_probs[last], draft_probs[last]), generator)
    return path, sample(target_probs[last], generator)


def verify_mss(
    tree: TokenTree, target_probs: torch.Tensor, draft_probs: torch.Tensor, generator: torch.Generator | None
) -> tuple[list[int], int]:
    """Tree multi-step speculative sampling (SpecInfer, Miao et al. 2024; the verifier of STree
    §5.2 "MSS sampling").

    At a row with children c_1..c_k, try each in packed order: accept c with probability
    min(1, p(c)/q(c)) and descend; on rejection p <- norm(max(p - q, 0)). For trees drawn without
    replacement (tree.sampling == "without_replacement") the draft side is updated too,
    q <- norm(q with c zeroed): recursive rejection sampling (Jeon et al. 2024), since the next
    sibling was drawn from exactly that q. If every child is rejected, emit a sample of the
    current residual p. Refuses deterministic trees (no q to reject against; use membership).
    """
    _require_draft_probs(tree, draft_probs, "mss")
    _check_rows(tree, target_probs, "target_probs")
    without_replacement = tree.sampling == "without_replacement"
    children = tree.children_table()
    path: list[int] = []
    row = 0
    while True:
        kids = children[row]
        q = draft_probs[row] if kids else None  # leaves have no q row worth reading
        child, p = _mss_node(tree, kids, target_probs[row], q, without_replacement, generator)
        if child is None:
            if row in tree.rejected_rows:  # the union bridge's draw outside T at this leaf: rejected too
                p = residual(p, draft_probs[row])
            return path, sample(p, generator)
        path.append(child)
        row = child + 1


def _mss_node(
    tree: TokenTree,
    children: Sequence[int],
    p: torch.Tensor,
    q: torch.Tensor | None,
    without_replacement: bool,
    generator: torch.Generator | None,
) -> tuple[int | None, torch.Tensor]:
    """One row of ``verify_mss``: the accepted child, or None and the residual p left after
    rejecting every child (p itself for a leaf)."""
    for c in children:
        x = tree.tokens[c]
        if _accept_draft(float(p[x]), float(q[x]), generator):
            return c, p
        p = residual(p, q)
        if without_replacement:  # the next sibling was drawn from q without x
            q = q.float().clone()
            q[x] = 0.0
            q = q / q.sum().clamp_min(torch.finfo(torch.float32).tiny)
    return None, p


def verify_membership(
    tree: TokenTree, target_probs_or_logits: torch.Tensor, generator: torch.Generator | None, greedy: bool
) -> tuple[list[int], int]:
    """Target-sampling membership (STree §5.2 "naive sampling", after SpecInfer and SpecExec).

    At each row draw the target's own token t ~ p (argmax when ``greedy``; then logits do as well
    as probs); descend into the child carrying t, else stop and emit t. The emitted tokens are
    plain target samples whatever the tree holds, so it is lossless for any tree, including
    deterministic top-k and n-gram trees.
    """
    _check_rows(tree, target_probs_or_logits, "target_probs_or_logits")
    children = tree.children_table()
    path: list[int] = []
    row = 0
    while True:
        dist = target_probs_or_logits[row]
        t = argmax_rows(dist) if greedy else sample(dist, generator)
        child = _child_with_token(tree, children[row], t)
        if child is None:
            return path, t
        path.append(child)
        row = child + 1


def verify_race(
    tree: TokenTree, target_probs: torch.Tensor, noise_at_depth: Callable[[int], torch.Tensor]
) -> tuple[list[int], int]:
    """Exponential-race speculative decoding acceptance (exponential-races Alg. 2 lines 8-13; Alg. 5 lines 13-22).

    ``noise_at_depth(d)`` is the Exp(1) noise (V,) of the output position d steps below the root
    (d = 0: the root's children). The target's token at a row of depth d is
    race_winner(p_row, noise(d)); descend into the child carrying it, else stop and emit it. The
    noise depends only on the position, so the emitted tokens are exactly those of autoregressive
    race sampling with the same noise, whatever the drafter proposed.
    """
    _check_rows(tree, target_probs, "target_probs")
    children = tree.children_table()
    path: list[int] = []
    row, depth = 0, 0
    while True:
        t = race_winner(target_probs[row], noise_at_depth(depth))
        child = _child_with_token(tree, children[row], t)
        if child is None:
            return path, t
        path.append(child)
        row, depth = child + 1, tree.depth[child]


# ---- entry points ---------------------------------------------------------------------------------
def accept(
    tree: TokenTree,
    target_logits: torch.Tensor,
    *,
    method: str,
    temperature: float,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    noise_at_depth: Callable[[int], torch.Tensor] | None = None,
    top_k: int = 0,
    min_p: float = 0.0,
) -> tuple[list[int], int]:
    """Verify ``tree`` against the target's logits (T + 1, V) with ``method`` (greedy | rs | mss |
    membership | race); returns (path, bonus).

    At temperature 0 every method is greedy verification: the target is one-hot, rejection
    sampling then accepts exactly the argmax and its residual is the argmax, membership samples the
    argmax and the race winner is the argmax. For T > 0, probabilities are computed only for the
    rows the walk reads (temperature and the top-k, top-p and min-p cuts applied: the distribution
    that plain sampling draws from; q is the drafter's own, whatever cuts it took).
    """
    if method not in METHODS:
        raise ValueError(f"unknown verifier {method!r}; choose one of {', '.join(METHODS)}")
    if temperature <= 0:
        return verify_greedy(tree, target_logits)
    if method == "greedy":
        raise ValueError("greedy verification needs temperature 0")
    target_probs = _RowProbs(target_logits, temperature, top_p, top_k, min_p)
    if method == "rs":
        return verify_rejection(tree, target_probs, tree.draft_probs, generator)
    if method == "mss":
        return verify_mss(tree, target_probs, tree.draft_probs, generator)
    if method == "membership":
        return verify_membership(tree, target_probs, generator, greedy=False)
    if noise_at_depth is None:
        raise ValueError("race verification needs noise_at_depth (the per-position race noise)")
    return verify_race(tree, target_probs, noise_at_depth)


def sample_next(
    logits_row: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    top_k: int = 0,
    min_p: float = 0.0,
) -> int:
    """Plain autoregressive next token from logits (V,): argmax at T = 0; otherwise a sample of
    the tempered distribution after the top-k, top-p and min-p cuts, drawn with ``generator`` or, when ``noise`` (the
    race noise of this position) is given, as the race winner (the ERSD reference sampler)."""
    if temperature <= 0:
        return argmax_rows(logits_row)
    probs = probs_from_logits(logits_row, temperature, top_p, top_k, min_p)
    if noise is not None:
        return race_winner(probs, noise)
    return sample(probs, generator)
