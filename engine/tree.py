"""Token trees: the packed draft structure every drafter produces and every verifier reads.

Packing (ALGORITHMS.md §1): T draft nodes in topological order (a parent precedes its children).

    tokens[T]   token id of each node
    parents[T]  index of the parent node, -1 = child of the root
    depth[T]    1 for children of the root

The *root* is the pending token: the last emitted token, which the target has not processed yet.
Verification feeds the packed sequence ``[root] + nodes`` (T + 1 rows) to the model, at positions
``committed_len + [0] + depth`` (the ALGORITHMS.md formula ``committed_len + depth - 1`` with the
root counted as committed). Row 0 of the resulting distribution predicts the root's children,
row i + 1 the children of node i.

``draft_probs`` (optional, shape [T + 1, V]) follows the same row convention: the drafter's
distribution at the root and at each node, from which that node's children were drawn. Rows of
nodes that were never expanded are left zero. Deterministic drafters (n-gram lookup, greedy
top-k at T = 0) leave it ``None``; verifiers that need q then refuse such trees.

``sampling`` records how siblings were drawn, which the verifier must know to stay lossless:

    "iid"                 children drawn independently from q (SpecInfer multi-step sampling)
    "without_replacement" children drawn from q without replacement (recursive rejection sampling)
    "deterministic"       no q (n-gram, top-k at T = 0); only greedy or membership verification
    "race"                exponential-race drafts (ERSD): first k arrivals under q
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # torch stays out of this module's import so the UI can use trees and shapes
    import torch

SAMPLING_KINDS = ("iid", "without_replacement", "deterministic", "race")


def shape_size(shape: Sequence[int]) -> int:
    """Number of nodes in a static shape (N1, ..., Ngamma): sum_i prod_{j<=i} N_j."""
    total, width = 0, 1
    for n in shape:
        width *= n
        total += width
    return total


def parse_shape(text: str) -> tuple[int, ...]:
    """'3,2,2,1,1' -> (3, 2, 2, 1, 1) with a clear error for bad input."""
    fields = str(text).replace(" ", "").split(",")
    # an empty field is refused, not dropped: `tree:3--2` (3 then -2?) ran as 3,2 and `tree:-3` as 3
    shape = tuple(int(x) for x in fields) if all(x.isascii() and x.isdigit() for x in fields) else ()
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"bad tree shape {text!r}: expected comma-separated positive integers, e.g. 3,2,2,1,1")
    if shape_size(shape) > 256:
        raise ValueError(f"tree shape {text!r} has {shape_size(shape)} nodes; the limit is 256")
    return shape


@dataclass
class TokenTree:
    """A packed draft tree (see module docstring)."""

    tokens: list[int]
    parents: list[int]
    draft_probs: "torch.Tensor | None" = None  # [T + 1, V] or None
    sampling: str = "deterministic"
    depth: list[int] = field(default_factory=list)
    # rows whose (single) drafted child was drawn outside the target's vocabulary and dropped: the
    # union bridge (Alg. 1); rejection sampling treats the draw as rejected at that row
    rejected_rows: set[int] = field(default_factory=set)
    # a greedy chain drafted with DraftRequest.confidence: the drafter's probability of each node's
    # token (engine/gate.py chooses how much of the chain to verify from it); empty otherwise
    confidence: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents differ in length")
        if self.sampling not in SAMPLING_KINDS:
            raise ValueError(f"unknown sampling kind {self.sampling!r}")
        depth: list[int] = []
        for i, p in enumerate(self.parents):
            if p >= i or p < -1:
                raise ValueError(f"bad parent {p} for node {i}: parents must be -1 or an earlier node (topological order)")
            depth.append(1 if p < 0 else depth[p] + 1)
        if self.depth and list(self.depth) != depth:
            raise ValueError("depth does not match parents")
        self.depth = depth
        if self.draft_probs is not None and self.draft_probs.shape[0] != len(self.tokens) + 1:
            raise ValueError(f"draft_probs has {self.draft_probs.shape[0]} rows, expected T + 1 = {len(self.tokens) + 1}")

    # ---- constructors -------------------------------------------------------------------------
    @classmethod
    def empty(cls) -> "TokenTree":
        return cls([], [])

    @classmethod
    def chain(cls, tokens: Sequence[int], draft_probs: "torch.Tensor | None" = None, sampling: str | None = None) -> "TokenTree":
        tokens = [int(t) for t in tokens]
        parents = list(range(-1, len(tokens) - 1))
        if sampling is None:
            sampling = "iid" if draft_probs is not None else "deterministic"
        return cls(tokens, parents, draft_probs, sampling)

    def truncated(self, n: int) -> "TokenTree":
        """The first ``n`` nodes (packed order is topological, so still a tree)."""
        if n >= len(self.tokens):
            return self
        probs = None if self.draft_probs is None else self.draft_probs[: n + 1]
        return TokenTree(self.tokens[:n], self.parents[:n], probs, self.sampling,
                         rejected_rows={r for r in self.rejected_rows if r <= n}, confidence=self.confidence[:n])

    # ---- structure ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depth, default=0)

    def widths(self) -> list[int]:
        """Nodes per depth (depth 1 first): the shape actually drafted."""
        out = [0] * self.max_depth
        for d in self.depth:
            out[d - 1] += 1
        return out

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (-1 = root), in packed (i.e. rank) order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def children_table(self) -> list[list[int]]:
        """children_table()[r] = children of row r, where row 0 is the root and row i + 1 node i."""
        table: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents):
            table[p + 1].append(i)
        return table

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` inclusive."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def path_tokens(self, path: Sequence[int]) -> list[int]:
        return [self.tokens[i] for i in path]

    def ancestor_mask(self, with_root: bool = True) -> "torch.Tensor":
        """anc[i, j] = True iff j is i or an ancestor of i (ALGORITHMS.md §1).

        With ``with_root`` the root is row/column 0 and nodes are shifted by one: the layout the
        model's verify pass uses.
        """
        import torch

        off = 1 if with_root else 0
        n = len(self) + off
        anc = torch.zeros(n, n, dtype=torch.bool)
        if with_root:
            anc[:, 0] = True
        for i, p in enumerate(self.parents):
            r = i + off
            if p >= 0:
                anc[r] = anc[p + off]
            anc[r, r] = True
        return anc

    def packed(self, root_token: int) -> tuple[list[int], list[int]]:
        """(tokens, parents) of ``[root] + nodes`` with parents as packed row indices (root's is -1)."""
        return [int(root_token)] + list(self.tokens), [-1] + [p + 1 for p in self.parents]


def static_tree_layout(shape: Sequence[int]) -> list[int]:
    """Parents of a full static shape in breadth-first order; node i's children are contiguous."""
    parents: list[int] = []
    frontier = [-1]
    for n in shape:
        nxt = []
        for p in frontier:
            for _ in range(n):
                parents.append(p)
                nxt.append(len(parents) - 1)
        frontier = nxt
    return parents


def describe_shape(shape: Sequence[int]) -> str:
    return ",".join(str(n) for n in shape)


def expected_width(shape: Sequence[int]) -> list[int]:
    """B_i = N1 * ... * N_i, the number of nodes at each depth (mamba-drafters §4.1)."""
    return [math.prod(shape[: i + 1]) for i in range(len(shape))]
