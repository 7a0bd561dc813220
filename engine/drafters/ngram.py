"""Prompt n-gram lookup (snakes-and-ladders §5.2; ALGORITHMS.md §7): model-free drafts; with a
datastore of the target's own n-grams (engine/drafters/corpus.py), chains that go on past the
context's matches (``corpus_chain``, used by ``pld:auto``).

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


CORPUS_REACH = 0.05  # a datastore chain stops once the product of its shares falls below this


class NgramDrafter:
    name = "ngram"

    def __init__(self, branches: int = 1, corpus=None):
        self.branches = branches
        self.corpus = corpus  # engine.drafters.corpus.CorpusIndex: the target's own n-grams (pld:auto), or None

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

    def corpus_chain(self, history: Sequence[int], k: int, ngram_min: int = 2, ngram_max: int = 6) -> TokenTree:
        """A chain of up to ``k``: what followed the context's latest longest match (as prompt
        lookup drafts it), then token by token the datastore's most frequent continuation of the
        chain so far (engine/drafters/corpus.py), with the confidence of each token recorded for
        the gate's cut (engine/gate.py): gate.COPIED for copied tokens (calibrated apart), the
        datastore's share else; the datastore's part stops where the product of its shares falls
        below CORPUS_REACH (no cut would keep it)."""
        from ..gate import COPIED

        conts = self.continuations(history, k, 1, ngram_min, ngram_max)
        chain = list(conts[0]) if conts else []
        confidence = [COPIED] * len(chain)
        if self.corpus is not None:
            ctx = list(history[-self.corpus.n_max:]) + chain
            reach = 1.0
            while len(chain) < k:
                nxt = self.corpus.next(ctx[-self.corpus.n_max:])
                if nxt is None:
                    break
                reach *= nxt[1]
                if reach < CORPUS_REACH:
                    break
                chain.append(nxt[0])
                confidence.append(nxt[1])
                ctx.append(nxt[0])
        tree = TokenTree.chain(chain)
        tree.confidence = confidence
        return tree

    def propose(self, history: Sequence[int], req: DraftRequest) -> TokenTree:
        if req.corpus and req.confidence and all(w == 1 for w in req.shape):
            return self.corpus_chain(history, min(len(req.shape), req.max_nodes), req.ngram_min, req.ngram_max)
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
