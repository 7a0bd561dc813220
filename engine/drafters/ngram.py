"""Prompt n-gram lookup (snakes-and-ladders §5.2; ALGORITHMS.md §7): model-free drafts; with a
datastore of the target's own n-grams (engine/drafters/corpus.py), trees that branch and go on past
the context's matches (``corpus_tree``, used by ``pld:auto``).

Find the most recent earlier occurrences of the context's last n tokens (n from ``ngram_max``
down to 1) in prompt + output and propose what followed them. Several distinct continuations
become several branches of one tree (merged as a trie, most recent match first), so a repeated
phrase with two possible continuations costs one verify pass instead of two misses.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable, Sequence

import numpy as np

from ..tree import TokenTree
from .base import DraftRequest


class NgramDrafter:
    name = "ngram"

    def __init__(self, branches: int = 1, corpus=None):
        self.branches = branches
        self.corpus = corpus  # engine.drafters.corpus.CorpusIndex: the target's own n-grams (pld:auto), or None

    def reset(self) -> None:
        pass

    def continuations(self, history: Sequence[int], k: int, branches: int, ngram_min: int = 2, ngram_max: int = 6,
                      lengths: list[int] | None = None) -> list[list[int]]:
        """Up to ``branches`` distinct continuations of length <= k, longest n-gram match first,
        then most recent first. A 1-token match is mostly noise: on SmolLM2 chat prompts,
        ngram_min=2 turned pld from 0.92x into 1.16x of ar (bench/results, issue 2 note).
        ``lengths``: a list that receives each continuation's match length."""
        h = np.asarray(history, dtype=np.int64)
        L = len(h)
        found: list[list[int]] = []
        nmax = min(ngram_max, L - 1)
        nmin = max(1, ngram_min)
        if nmax < nmin:
            return found
        # A match of the context's last n tokens ending at e (h[e-n:e] == h[L-n:], e <= L - 1)
        # proposes h[e:e+k], whatever n: so each end e counts once, at its longest match m(e)
        # (<= nmax, <= e), in the order n descending then most recent first, as a scan of every n
        # from nmax down would find them (that scan, five sliding-window passes over the history,
        # took 100-260 us a step at 200-1,500 tokens).
        ends = np.nonzero(h[:L - 1] == h[L - 1])[0] + 1
        if not len(ends):  # the last token never occurred before: nothing to copy
            return found
        m = np.ones(len(ends), dtype=np.int64)
        alive = np.ones(len(ends), dtype=bool)
        for j in range(1, nmax):
            ok = ends - 1 - j >= 0
            alive &= ok
            alive[alive] &= h[ends[alive] - 1 - j] == h[L - 1 - j]
            m += alive
        keep = m >= nmin
        ends, m = ends[keep], m[keep]
        seen: set[tuple[int, ...]] = set()
        for i in np.lexsort((-ends, -m)):  # longest match first, then most recent
            e = int(ends[i])
            cont = h[e:e + k].tolist()
            key = tuple(cont)
            if not cont or key in seen:
                continue
            seen.add(key)
            found.append(cont)
            if lengths is not None:
                lengths.append(int(m[i]))
            if len(found) >= branches:
                return found
        return found

    def corpus_tree(self, history: Sequence[int], max_nodes: int, calibrate: Callable[[float], float] | None = None,
                    worth: Callable[..., bool] | None = None, branches: int = 3, ngram_min: int = 2,
                    ngram_max: int = 6, spine=None, chain: bool = False, scorer=None) -> TokenTree:
        """A draft tree grown best first (EAGLE-2's dynamic tree over REST's datastore): one node
        at a time, always the candidate with the highest path probability, the product of the
        calibrated confidences (``calibrate``) from the root, among the datastore's top
        ``branches`` continuations of every node's context (engine/drafters/corpus.py) and the
        next token copied from the context's latest longest match (as prompt lookup drafts it;
        confidence gate.COPIED). Nodes come out in that order, so every prefix of the tree is a
        tree (parents first) and the gate cuts it to its best prefix; each node's own confidence
        is recorded (TokenTree.confidence). It stops at ``max_nodes``, when no candidate is left,
        or where ``worth(nodes so far, P)`` says a node of path probability P cannot pay for its
        row (no later candidate has a higher P).

        ``spine`` (engine/drafters/model.Spine, hybrid:auto): a drafter model joins in along one
        path, the one the best-first order takes: its top tokens are candidates for the root's
        children and, each time the first child of the path's end is grown, the drafter steps
        with that token and proposes that node's children (while ``worth(n, P, step ms)`` says a
        step can pay). A token only the drafter proposed has confidence gate.MODEL + p, one the
        drafter and the copy or the datastore both proposed gate.AGREE + p (p the drafter's
        probability), calibrated apart (engine/gate.py).

        ``chain``: one node a depth, the best calibrated candidate among the children of the last
        (hybrid:K with a datastore: a chain of K whose every token comes from whichever source is
        likeliest right there); the copy is looked up again from the context plus the chain
        wherever the chain leaves the match it was following, as prompt lookup would after it.
        ``scorer`` (chains only; engine/chain_scorer.ChainScorer, shipped beside a drafter): the
        candidate drafted at each depth is the one it scores highest from what every source says
        of it together (the copy's match length, the datastore's share, rank and suffix, the
        drafter's probability and rank), in place of the best calibrated confidence; the nodes
        keep their confidence codes for the gate's calibration."""
        from ..chain_scorer import features
        from ..gate import AGREE, COPIED, MODEL, raw_probability

        cal = calibrate or raw_probability
        if not chain:
            scorer = None
        if scorer is not None and worth is not None:
            raise ValueError("a scored chain has no cost cut (its scores are not probabilities)")
        h_arr = np.asarray(history, dtype=np.int64)  # once: a chain's re-lookups extend it
        lens: list[int] = []
        conts = self.continuations(h_arr, max_nodes, 1, ngram_min, ngram_max, lengths=lens)
        copy = tuple(conts[0]) if conts else ()
        copy_len = lens[0] if lens else 0  # the match length ``copy`` continues (the scorer's feature)
        copy_at = 0  # chains: the path length at which ``copy`` was looked up
        n_ctx = self.corpus.n_max if self.corpus is not None else 0
        base = list(history[len(history) - n_ctx:]) if n_ctx else []
        tokens: list[int] = []
        parents: list[int] = []
        confidence: list[float] = []
        paths: list[tuple[int, ...]] = []
        heap: list = []
        tick = itertools.count()

        def push_children(node: int, path: tuple[int, ...], reach: float, model: Sequence[tuple[int, float]] = ()) -> None:
            nonlocal copy, copy_at, copy_len
            kids: dict[int, float] = {}
            j = len(path) - copy_at
            on_copy = copy[:j] == path[copy_at:]
            if chain and (not on_copy or (j >= len(copy) and j > 0)):
                # off the match, or at the end of a copy the history's end cut short (a repeating
                # stretch: "1 2 1 2" copies 2 tokens): look again from the context and the chain
                lens.clear()
                got = self.continuations(np.concatenate((h_arr, np.asarray(path, dtype=np.int64))), max_nodes - len(path), 1,
                                         ngram_min, ngram_max, lengths=lens)
                copy, copy_at, j, on_copy = (tuple(got[0]) if got else ()), len(path), 0, True
                copy_len = lens[0] if lens else 0
            if on_copy and j < len(copy):
                kids[copy[j]] = COPIED
            top, suffix = (self.corpus.top_suffix((base + list(path))[-n_ctx:], branches) if self.corpus is not None
                           else ([], 0))
            for t, p in top:
                if t not in kids or cal(p) > cal(kids[t]):
                    kids[t] = p
            for t, p in model:
                kids[t] = (AGREE if t in kids else MODEL) + p
            if scorer is not None:  # rank by what all sources say of each candidate (engine/chain_scorer.py)
                ds = {t: (r, p) for r, (t, p) in enumerate(top)}
                dr = {t: (r, p) for r, (t, p) in enumerate(model)}
                dr_top, ds_top = (model[0][1] if model else 0.0), (top[0][1] if top else 0.0)
                copied = copy[j] if on_copy and j < len(copy) else None
                for t, p in kids.items():
                    x = features(min(copy_len + j, ngram_max) if t == copied else 0, ds.get(t), suffix, dr.get(t), dr_top,
                                 ds_top)  # the match grows along the copy (capped as a fresh lookup's is)
                    heapq.heappush(heap, (-scorer.score(x), next(tick), node, t, p))
                return
            for t, p in kids.items():
                heapq.heappush(heap, (-reach * cal(p), next(tick), node, t, p))

        tip = -1 if spine is not None else None  # the node whose children the drafter model proposes
        push_children(-1, (), 1.0, spine.candidates() if spine is not None else ())
        while heap and len(tokens) < max_nodes:
            neg, _, parent, t, p = heapq.heappop(heap)
            if worth is not None and not worth(len(tokens), -neg):
                break
            path = (paths[parent] if parent >= 0 else ()) + (t,)
            tokens.append(t)
            parents.append(parent)
            confidence.append(p)
            paths.append(path)
            if len(tokens) >= max_nodes:  # full: no more children to propose (nor a drafter step for them)
                break
            if chain:
                heap.clear()  # one node a depth: only the new node's children compete next
            model: Sequence[tuple[int, float]] = ()
            if tip is not None and parent == tip:  # the first child of the path's end: the drafter follows it
                tip = None
                if spine.can_advance() and (worth is None or worth(len(tokens), -neg, spine.ms)):
                    spine.advance(t)
                    model, tip = spine.candidates(), len(tokens) - 1
            push_children(len(tokens) - 1, path, -neg, model)
        return TokenTree(tokens, parents, None, "deterministic", confidence=confidence)

    def propose(self, history: Sequence[int], req: DraftRequest) -> TokenTree:
        if req.corpus and req.confidence:
            return self.corpus_tree(history, req.max_nodes, req.calibrate, req.worth, ngram_min=req.ngram_min,
                                    ngram_max=req.ngram_max)
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
