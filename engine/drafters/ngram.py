"""Prompt n-gram lookup (snakes-and-ladders §5.2; ALGORITHMS.md §7): model-free drafts.

Find the most recent earlier occurrences of the context's last n tokens (n from ``ngram_max``
down to 1) in prompt + output and propose what followed them. Several distinct continuations
become several branches of one tree (merged as a trie, most recent match first), so a repeated
phrase with two possible continuations costs one verify pass instead of two misses.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..tree import TokenTree
from .base import DraftRequest


class NgramDrafter:
    name = "ngram"

    def __init__(self, branches: int = 1):
        self.branches = branches

    def reset(self) -> None:
        pass

    def continuations(self, history: Sequence[int], k: int, branches: int, ngram_min: int = 2, ngram_max: int = 6) -> list[list[int]]:
        """Up to ``branches`` distinct continuations of length <= k, longest n-gram match first,
        then most recent first. A 1-token match is mostly noise: on SmolLM2 chat prompts,
        ngram_min=2 turned pld from 0.92x into 1.16x of ar (bench/results, issue 2 note)."""
        h = np.asarray(history, dtype=np.int64)
        L = len(h)
        found: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(min(ngram_max, L - 1), max(1, ngram_min) - 1, -1):
            suffix = h[L - n:]
            # Windows h[i:i+n] for i in [0, L-n): exclude the suffix itself.
            win = np.lib.stride_tricks.sliding_window_view(h[:L - 1], n)
            hits = np.nonzero((win == suffix).all(axis=1))[0]
            for i in hits[::-1]:  # most recent first
                cont = h[i + n:i + n + k].tolist()
                if not cont:
                    continue
                key = tuple(cont)
                if key in seen:
                    continue
                seen.add(key)
                found.append(cont)
                if len(found) >= branches:
                    return found
        return found

    def propose(self, history: Sequence[int], req: DraftRequest) -> TokenTree:
        k = len(req.shape)
        branches = max(self.branches, req.shape[0]) if len(req.shape) else self.branches
        conts = self.continuations(history, k, branches, req.ngram_min, req.ngram_max)
        tokens: list[int] = []
        parents: list[int] = []
        children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        for cont in conts:
            parent = -1
            for t in cont:
                key = (parent, t)
                if key not in children:
                    if len(tokens) >= req.max_nodes:
                        break
                    tokens.append(t)
                    parents.append(parent)
                    children[key] = len(tokens) - 1
                parent = children[key]
        return TokenTree(tokens, parents, None, "deterministic")
