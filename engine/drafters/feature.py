"""Feature drafter: engine/feature_head.FeatureHead drafting from the target's own hidden states.

The decoder hands it the target's final-norm hidden row of every committed position (``append``
after each prefill piece and each step's commit; ``truncate`` where the context is cut back), so
``features`` always covers positions 0 .. committed-1. A step then runs, in one call of the head's
layer, the positions the head has not seen yet (true features: the accepted path's and the root's
predecessor), keeps their keys/values, and drafts deterministically from the root: a chain or a
static tree (every node at depth i-1 gets N_i children, ranked by the head's logits), deeper nodes
fed the head's own predicted features, each depth one batched call over a tree mask. The drafts are
deterministic (``sampling="deterministic"``): greedy or membership verification decides, so the
head never touches what is emitted.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from ..feature_head import FeatureHead
from ..tree import TokenTree
from .base import DraftRequest


SCRATCH = 264  # draft rows a step may add after the committed ones (a tree's 256 nodes and a spine's path)


class FeatureDrafter:
    name = "model"
    supports_confidence = True  # greedy chains record the head's probability of each draft

    def __init__(self, head: FeatureHead, embed: torch.Tensor, lm_head: torch.Tensor, capacity: int,
                 q8: bool | None = None):
        import os

        from ..feature_head import as_llama
        from ..models.common import Linear

        self.head = head.float().eval().attach(embed, lm_head.float())
        if q8 is None:  # Q8_0 products on a CPU (a depth streams ~10 MB rather than ~37); SPECCHAT_DRAFT_Q8=0: fp32
            q8 = os.environ.get("SPECCHAT_DRAFT_Q8", "1").strip().lower() not in ("0", "off", "false", "no")
        # the layer as a one-layer engine Llama: one C call a depth, the engine's tree KV cache
        # (committed rows = positions the head has read with true features; a step's drafts in scratch)
        self.model = as_llama(self.head, capacity + SCRATCH, q8=q8)
        fc = Linear(self.head.fc.weight.detach().float(), torch.float32)
        self.fc = fc.to_q8_0() if q8 else fc
        self.embed = embed
        D = head.cfg["hidden"]
        self.capacity = capacity
        self.features = torch.zeros(capacity, D, dtype=torch.float32)
        self.n_feat = 0  # positions 0 .. n_feat-1 hold the target's hidden rows
        self.caught_up = 0  # rows the last catch-up ran (the decoder books what catching up costs)
        self.sync_ms = 0.0
        self.step_ms = 0.0  # a spine step's recent cost (ms, EWMA)
        self.seen: list[int] = []  # seen[j]: the token head row j read (history[j + 1])

    @property
    def kv_n(self) -> int:
        """Head rows committed: row j read (history[j + 1], features[j])."""
        return self.model.cache.length

    def _inputs(self, tokens: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        from ..models.common import embed_rows, mm

        e = embed_rows(self.embed, tokens).to(torch.float32)
        return mm(torch.cat([e, feats], -1), self.fc)

    def _rows(self, x: torch.Tensor, parents: list[int]) -> torch.Tensor:
        """Rows x (T, D) as scratch nodes under ``parents`` (scratch rows; -1: after the committed
        rows): their predicted features (T, D), keys/values kept in scratch."""
        m = self.model
        cache = m.cache
        start, positions, mask = cache.extend_plan(parents)
        try:
            return m.forward_x(x, positions, start, mask)
        finally:
            if mask is not None:
                cache.release_mask(len(parents), start + len(parents))

    def _logits(self, f: torch.Tensor) -> torch.Tensor:
        return self.model.logits(f)

    # ---- kept in step by the decoder ----------------------------------------------------------------
    def reset(self) -> None:
        self.n_feat = 0
        self.model.cache.reset()
        self.seen = []

    def truncate(self, n: int) -> None:
        """The context keeps positions < n (its token at n may change): features past n and head
        rows reading a token at n or later are dropped."""
        n = max(0, int(n))
        self.n_feat = min(self.n_feat, n)
        cache = self.model.cache
        cache.clear_scratch()
        if cache.length > max(n - 1, 0):
            cache.rollback(max(n - 1, 0))
        del self.seen[cache.length:]

    def append(self, rows: torch.Tensor) -> None:
        """The target's hidden rows of the next committed positions, in order."""
        T = rows.shape[0]
        if self.n_feat + T > self.capacity:
            raise OverflowError("feature drafter context full")
        self.features[self.n_feat:self.n_feat + T] = rows.to(torch.float32)
        self.n_feat += T

    # ---- drafting ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _catch_up(self, history: Sequence[int]) -> torch.Tensor | None:
        """Run the head over the positions it has not seen (true features) up to the root's
        predecessor; return the root's predicted feature (1, D), or None where features are missing."""
        t0 = time.perf_counter()
        L = len(history)
        if L < 2 or self.n_feat < L - 1 or L - 1 > self.capacity:
            return None  # features missing (a mode that commits later): no draft this step
        cache = self.model.cache
        cache.clear_scratch()
        j = 0
        n = min(cache.length, len(self.seen))
        while j < n and self.seen[j] == history[j + 1]:  # (usually all: the context only grew)
            j += 1
        if j < cache.length:
            cache.rollback(j)
        del self.seen[j:]
        T = L - 1 - j
        x = self._inputs(torch.as_tensor(list(history[j + 1:L]), dtype=torch.long), self.features[j:L - 1])
        f = self._rows(x, list(range(-1, T - 1)))
        cache.commit(range(T))
        self.seen.extend(history[j + 1:L])
        self.caught_up = T
        self.sync_ms = (time.perf_counter() - t0) * 1000.0
        return f[-1:]

    @torch.inference_mode()
    def propose(self, history: Sequence[int], req: DraftRequest) -> TokenTree:
        f_root = self._catch_up(history)
        if f_root is None:
            return TokenTree.empty()
        return self._tree(f_root, req)

    def spine(self, history: Sequence[int], k: int = 3) -> "FeatureSpine":
        """hybrid's best-first trees and mixed chains step the head along one path (the ModelDrafter
        Spine protocol: candidates / can_advance / advance)."""
        return FeatureSpine(self, history, k)

    def _tree(self, f_root: torch.Tensor, req: DraftRequest) -> TokenTree:
        """Depth by depth from the root's predicted feature: each depth's new nodes in one call (the
        engine's tree mask: a node reads the committed rows and its ancestors); node i is scratch row i."""
        plan_shape = req.shape
        chain = all(n == 1 for n in plan_shape)
        vocab_ids = self.head.vocab_ids
        tokens: list[int] = []
        parents: list[int] = []
        conf: list[float] = []
        frontier_f = f_root  # (F, D) predicted features of the frontier (the root first)
        frontier_ids = [-1]  # node index of each frontier row (-1: the root)
        depth = 0
        for width in plan_shape:
            if len(tokens) >= req.max_nodes:
                break
            logits = self._logits(frontier_f).float()  # (F, Vd)
            kk = min(width, logits.shape[-1])
            top = logits.topk(kk, dim=-1)
            probs = torch.softmax(logits, -1) if (req.confidence and chain) else None
            new_nodes = []
            for r, node in enumerate(frontier_ids):
                for c in range(kk):
                    if len(tokens) >= req.max_nodes:
                        break
                    idx = int(top.indices[r, c])
                    tokens.append(int(vocab_ids[idx]))
                    parents.append(node)
                    new_nodes.append((len(tokens) - 1, r))
                    if probs is not None:
                        conf.append(float(probs[r, idx]))
            depth += 1
            if probs is not None and req.keep_going is not None and not req.keep_going(conf):
                break
            if depth == len(plan_shape) or not new_nodes or len(tokens) >= req.max_nodes:
                break
            # the new nodes' predicted features: each reads its token and its parent's feature
            ids = torch.tensor([tokens[n] for n, _ in new_nodes])
            pf = frontier_f[torch.tensor([r for _, r in new_nodes])]
            frontier_f = self._rows(self._inputs(ids, pf), [parents[n] for n, _ in new_nodes])
            frontier_ids = [n for n, _ in new_nodes]
        return TokenTree(tokens, parents, sampling="deterministic", confidence=conf if chain and req.confidence else [])


class FeatureSpine:
    """The head stepped along one path of a tree grown elsewhere (engine/drafters/ngram.corpus_tree):
    ``candidates`` are its top-k (token, probability) after the path, ``advance(token)`` one layer
    call for the path's next node (a scratch row reading the committed rows and the path's nodes)."""

    def __init__(self, drafter: FeatureDrafter, history: Sequence[int], k: int = 3):
        self.d, self.k = drafter, k
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.f = drafter._catch_up(history)
        if self.f is None:
            raise OverflowError("no features for this context")  # the caller drafts without the head
        self.synced, self.sync_ms = drafter.caught_up, (time.perf_counter() - t0) * 1000.0
        self.spent_ms = self.sync_ms
        self.srow = -1  # the scratch row of the path's end (-1: the root)
        self.steps = 0
        self.room = SCRATCH - 8

    @property
    def ms(self) -> float:
        return self.d.step_ms

    def candidates(self) -> list[tuple[int, float]]:
        t0 = time.perf_counter()
        with torch.inference_mode():
            p, i = torch.softmax(self.d._logits(self.f).float()[0], -1).topk(self.k)
            out = list(zip(self.d.head.vocab_ids[i].tolist(), p.tolist()))
        self.spent_ms += (time.perf_counter() - t0) * 1000.0
        return out

    def can_advance(self) -> bool:
        return self.steps < self.room

    def advance(self, token: int) -> None:
        t0 = time.perf_counter()
        d = self.d
        with torch.inference_mode():
            s0 = d.model.cache.scratch
            self.f = d._rows(d._inputs(torch.tensor([token]), self.f), [self.srow])
        self.srow = s0
        self.steps += 1
        ms = (time.perf_counter() - t0) * 1000.0
        self.spent_ms += ms
        d.step_ms = ms if d.step_ms == 0.0 else 0.8 * d.step_ms + 0.2 * ms
