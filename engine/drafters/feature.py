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
    needs_features = True

    def __init__(self, head: FeatureHead, embed: torch.Tensor, lm_head: torch.Tensor, capacity: int,
                 dtype: torch.dtype = torch.float32, q8: bool | None = None):
        self.head = head.to(dtype).eval().attach(embed, lm_head.to(dtype))
        self.dtype = dtype
        self._fast(q8)
        D = head.cfg["hidden"]
        self.capacity = capacity
        self.features = torch.zeros(capacity, D, dtype=dtype)
        self.n_feat = 0  # positions 0 .. n_feat-1 hold the target's hidden rows
        H, E = head.H, head.E
        # the head's keys/values: committed rows at [0, kv_n), a step's draft nodes after them
        self.k = torch.zeros(1, H, capacity + SCRATCH, E, dtype=dtype)
        self.v = torch.zeros(1, H, capacity + SCRATCH, E, dtype=dtype)
        self.kv_n = 0  # head rows j < kv_n computed from (history[j + 1], features[j])
        self.caught_up = 0  # rows the last catch-up ran (the decoder books what catching up costs)
        self.sync_ms = 0.0
        self.step_ms = 0.0  # a spine step's recent cost (ms, EWMA)
        self.seen: list[int] = []

    def _fast(self, q8: bool | None) -> None:
        """The head's products as the engine multiplies weights (models/common.Linear: linear.c's
        blocks on a CPU), in Q8_0 where ``q8`` (default: on a CPU unless SPECCHAT_DRAFT_Q8=0): a draft
        depth streams ~10 MB instead of ~37 (fp32). Drafts only choose proposals: any rounding is
        lossless."""
        import os

        from ..models.common import Linear

        h = self.head
        cpu = h.fc.weight.device.type == "cpu"
        if q8 is None:
            q8 = cpu and os.environ.get("SPECCHAT_DRAFT_Q8", "1").strip().lower() not in ("0", "off", "false", "no")

        def lin(w: torch.Tensor):
            L = Linear(w.detach().float(), torch.float32)
            return L.to_q8_0() if q8 else L

        self.lin = None
        if self.dtype != torch.float32:
            return
        self.lin = {"fc": lin(h.fc.weight), "qkv": lin(h.wqkv.weight), "o": lin(h.wo.weight), "gu": lin(h.wgu.weight),
                    "d": lin(h.wd.weight), "head": lin(h.head)}

    def _inputs(self, tokens: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        from ..models.common import mm

        h = self.head
        if self.lin is None:
            return h.inputs(tokens[None], feats[None])[0]
        e = h.embed.index_select(0, tokens).to(torch.float32)
        return mm(torch.cat([e, feats.to(torch.float32)], -1), self.lin["fc"])

    def _layer(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None, P: int) -> torch.Tensor:
        """Rows x (T, D) at ``pos``, their keys/values written at [P, P + T), attending to [0, P + T)
        under ``mask`` (T, P + T; None: causal). Returns the predicted features (T, D)."""
        from ..models.common import mm

        h = self.head
        if self.lin is None:
            f, _ = h.layer(x[None], pos, mask=mask, cache=(self.k, self.v, P))
            return f[0]
        import torch.nn.functional as F

        T, D = x.shape
        H, E = h.H, h.E
        qkv = mm(h._rms(x, h.ln1), self.lin["qkv"]).view(T, 3, H, E).permute(1, 2, 0, 3)  # (3, H, T, E)
        q, k = h._rope(qkv[0], pos), h._rope(qkv[1], pos)
        self.k[0, :, P:P + T], self.v[0, :, P:P + T] = k, qkv[2]
        kk, vv = self.k[0, :, :P + T], self.v[0, :, :P + T]
        if mask is None:
            mask = torch.ones(T, P + T, dtype=torch.bool).tril(P)
        a = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)  # (H, T, E)
        y = x + mm(a.transpose(0, 1).reshape(T, H * E), self.lin["o"])
        g, u = mm(h._rms(y, h.ln2), self.lin["gu"]).chunk(2, -1)
        y = y + mm(F.silu(g) * u, self.lin["d"])
        return h._rms(y, h.lnf)

    def _logits(self, f: torch.Tensor) -> torch.Tensor:
        from ..models.common import mm

        return self.head.logits(f) if self.lin is None else mm(f, self.lin["head"])

    # ---- kept in step by the decoder ----------------------------------------------------------------
    def reset(self) -> None:
        self.n_feat = self.kv_n = 0
        self.seen = []

    def truncate(self, n: int) -> None:
        """The context keeps positions < n (its token at n may change): features past n and head
        rows reading a token at n or later are dropped."""
        n = max(0, int(n))
        self.n_feat = min(self.n_feat, n)
        self.kv_n = min(self.kv_n, max(n - 1, 0))
        del self.seen[max(n - 1, 0):]

    def append(self, rows: torch.Tensor) -> None:
        """The target's hidden rows of the next committed positions, in order."""
        T = rows.shape[0]
        if self.n_feat + T > self.capacity:
            raise OverflowError("feature drafter context full")
        self.features[self.n_feat:self.n_feat + T] = rows.to(self.dtype)
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
        h = self.head
        if self.seen[: self.kv_n] != list(history[1:self.kv_n + 1]):  # the context changed under us
            j = 0
            while j < self.kv_n and self.seen[j] == history[j + 1]:
                j += 1
            self.kv_n = j
        j0 = self.kv_n
        toks = torch.as_tensor(list(history[j0 + 1:L]), dtype=torch.long)
        x = self._inputs(toks, self.features[j0:L - 1])
        f = self._layer(x, torch.arange(j0, L - 1), None, j0)
        self.kv_n = L - 1
        self.seen = list(history[1:L])
        self.caught_up = L - 1 - j0
        self.sync_ms = (time.perf_counter() - t0) * 1000.0
        return f[-1:]

    @torch.inference_mode()
    def propose(self, history: Sequence[int], req: DraftRequest) -> TokenTree:
        f_root = self._catch_up(history)
        if f_root is None:
            return TokenTree.empty()
        return self._tree(f_root, len(history) - 1, req)

    def spine(self, history: Sequence[int], k: int = 3) -> "FeatureSpine":
        """hybrid's best-first trees and mixed chains step the head along one path (the ModelDrafter
        Spine protocol: candidates / can_advance / advance)."""
        return FeatureSpine(self, history, k)

    def _tree(self, f_root: torch.Tensor, base: int, req: DraftRequest) -> TokenTree:
        """Depth by depth from the root's predicted feature; ``base`` = the root's position (the input
        row of a node at depth d is base + d - 1: it reads the node and its parent's feature)."""
        h = self.head
        plan_shape = req.shape
        chain = all(n == 1 for n in plan_shape)
        tokens: list[int] = []
        parents: list[int] = []
        conf: list[float] = []
        frontier_f = f_root  # (F, D) predicted features of the frontier (the root first)
        frontier_ids = [-1]  # node index of each frontier row (-1: the root)
        anc: list[list[int]] = []  # each node's ancestors' scratch rows, itself included
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
                    tokens.append(int(h.vocab_ids[idx]))
                    parents.append(node)
                    anc.append((anc[node] if node >= 0 else []) + [len(tokens) - 1])
                    new_nodes.append((len(tokens) - 1, r))
                    if probs is not None:
                        conf.append(float(probs[r, idx]))
            depth += 1
            if probs is not None and req.keep_going is not None and not req.keep_going(conf):
                break
            if depth == len(plan_shape) or not new_nodes or len(tokens) >= req.max_nodes:
                break
            # the new nodes' predicted features: one call, each row attending to the committed rows
            # and its ancestors' scratch rows
            ids = torch.tensor([tokens[n] for n, _ in new_nodes])
            pf = frontier_f[torch.tensor([r for _, r in new_nodes])]
            x = self._inputs(ids, pf)
            pos = torch.full((len(new_nodes),), base + depth - 1, dtype=torch.long)  # node at token position base+depth: row base+depth-1
            P = self.kv_n
            first = new_nodes[0][0]
            n_all = first + len(new_nodes)
            mask = torch.zeros(len(new_nodes), P + n_all, dtype=torch.bool)
            mask[:, :P] = True
            for i, (n, _) in enumerate(new_nodes):
                mask[i, [P + a for a in anc[n]]] = True
            frontier_f = self._layer(x, pos, mask, P + first)  # node i's rows at P + i
            frontier_ids = [n for n, _ in new_nodes]
        return TokenTree(tokens, parents, sampling="deterministic", confidence=conf if chain and req.confidence else [])


class FeatureSpine:
    """The head stepped along one path of a tree grown elsewhere (engine/drafters/ngram.corpus_tree):
    ``candidates`` are its top-k (token, probability) after the path, ``advance(token)`` one layer
    call for the path's next node, reading the committed rows and the path's earlier nodes."""

    def __init__(self, drafter: FeatureDrafter, history: Sequence[int], k: int = 3):
        self.d, self.k = drafter, k
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.f = drafter._catch_up(history)
        if self.f is None:
            raise OverflowError("no features for this context")  # the caller drafts without the head
        self.synced, self.sync_ms = drafter.caught_up, (time.perf_counter() - t0) * 1000.0
        self.spent_ms = self.sync_ms
        self.pos = len(history) - 1  # the input row of the path's next node
        self.steps = 0
        self.room = SCRATCH

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
        d, h = self.d, self.d.head
        with torch.inference_mode():
            x = d._inputs(torch.tensor([token]), self.f)
            P = d.kv_n + self.steps  # the committed rows, then the path's earlier nodes
            self.f = d._layer(x, torch.tensor([self.pos]), torch.ones(1, P + 1, dtype=torch.bool), P)
        self.pos += 1
        self.steps += 1
        ms = (time.perf_counter() - t0) * 1000.0
        self.spent_ms += ms
        d.step_ms = ms if d.step_ms == 0.0 else 0.8 * d.step_ms + 0.2 * ms
