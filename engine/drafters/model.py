"""Model drafter: any engine model (same tokenizer as the target) drafts chains or static trees.

Transformer drafters grow the tree depth by depth in one forward per depth, every node attending
to the committed prefix and its ancestors (tree attention, ALGORITHMS.md §1; mamba-drafters §4.1
describes the same per-depth batching for recurrent drafters, which [ssm] adds via fork/step).

The drafter keeps its own cache in step with the conversation: on each ``propose`` it commits what
the target accepted, reusing the K/V of draft nodes it already computed on the accepted path, and
only runs the tokens it has not seen (usually just the target's correction/bonus token).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..models.base import CausalLM
from ..sampling import draft_sample, probs_from_logits, race_topk
from ..tree import TokenTree
from .base import DraftRequest


class ModelDrafter:
    name = "model"

    def __init__(self, model: CausalLM, target_vocab: int, label: str = "model"):
        self.model = model
        self.target_vocab = target_vocab
        self.label = label
        self.model.allocate()
        self.seen: list[int] = []  # tokens committed in the drafter's cache
        self._scratch_tokens: list[int] = []  # token of each scratch node (index = scratch row)
        self._root_logits: torch.Tensor | None = None

    def reset(self) -> None:
        self.model.cache.reset()
        self.seen = []
        self._scratch_tokens = []
        self._root_logits = None

    # ---- keeping in step with the conversation --------------------------------------------------------
    @torch.inference_mode()
    def _sync(self, history: Sequence[int]) -> torch.Tensor:
        """Bring the drafter's committed prefix to ``history`` (root included); return the logits
        that predict the token after the root."""
        history = list(history)
        cache = self.model.cache
        n = _common_prefix(self.seen, history)
        if n == len(self.seen) == len(history) and self._root_logits is not None:
            cache.clear_scratch()  # asked again for the same position: draft afresh
            self._scratch_tokens = []
            return self._root_logits
        n = min(n, len(history) - 1)
        if n < len(self.seen):
            if n != cache.length and not getattr(cache, "prefix_rollback", False):
                n = 0  # a recurrent state cannot return to an earlier prefix: rebuild it
            cache.rollback(n)
            del self.seen[n:]
            self._scratch_tokens = []
        else:
            # Reuse draft nodes on the accepted path: their K/V are in scratch already.
            rows = _match_chain(cache.scratch_parents, self._scratch_tokens, history[n:len(history) - 1])
            cache.commit(rows)
            self.seen.extend(history[n:n + len(rows)])
        self._scratch_tokens = []
        rest = history[len(self.seen):]
        room = cache.capacity - cache.length
        if len(rest) > room:
            raise OverflowError("drafter context full")
        if len(rest) > 1:
            self.model.prefill(rest[:-1])
        logits = self.model.extend([rest[-1]], [-1])[-1]
        cache.commit([0])
        self.seen = history
        self._root_logits = self._fit_vocab(logits)
        return self._root_logits

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Drafter rows beyond the target's vocabulary (padding) can never be proposed."""
        V = self.target_vocab
        logits = logits.float()
        if logits.shape[-1] > V:
            return logits[..., :V]
        if logits.shape[-1] < V:
            pad = torch.full((*logits.shape[:-1], V - logits.shape[-1]), float("-inf"))
            return torch.cat([logits, pad], dim=-1)
        return logits

    # ---- drafting ----------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, history: Sequence[int], req: DraftRequest) -> TokenTree:
        root_logits = self._sync(history)
        cache = self.model.cache
        tokens: list[int] = []
        parents: list[int] = []
        q_rows: dict[int, torch.Tensor] = {}
        # frontier: (tree node index or -1 for the root, logits predicting its children, scratch row)
        frontier: list[tuple[int, torch.Tensor, int]] = [(-1, root_logits, -1)]
        budget = min(req.max_nodes, cache.capacity - cache.length - 1)
        for d, width in enumerate(req.shape):
            new: list[tuple[int, int]] = []  # (tree node, parent's scratch row)
            for node, logits, srow in frontier:
                n = min(width, budget - len(tokens))
                if n <= 0:
                    break
                toks, q = self._choose(logits, n, d, req)
                if q is not None:
                    q_rows[node + 1] = q
                for t in toks:
                    tokens.append(t)
                    parents.append(node)
                    new.append((len(tokens) - 1, srow))
            if not new or d == len(req.shape) - 1 or len(tokens) >= budget:
                break
            s0 = cache.scratch
            out = self.model.extend([tokens[i] for i, _ in new], [p for _, p in new])
            self._scratch_tokens.extend(tokens[i] for i, _ in new)
            out = self._fit_vocab(out)
            frontier = [(i, out[j], s0 + j) for j, (i, _) in enumerate(new)]
        kind = "deterministic"
        probs = None
        if req.mode == "sample":
            kind = "without_replacement" if any(w > 1 for w in req.shape) else "iid"
            probs = torch.zeros(len(tokens) + 1, self.target_vocab)
            for r, q in q_rows.items():
                probs[r] = q
        elif req.mode == "race":
            kind = "race"
        return TokenTree(tokens, parents, probs, kind)

    def _choose(self, logits: torch.Tensor, n: int, depth: int, req: DraftRequest) -> tuple[list[int], torch.Tensor | None]:
        if req.mode == "greedy" or req.temperature <= 0:
            return torch.topk(logits, n).indices.tolist(), None
        q = probs_from_logits(logits, req.temperature, req.top_p)
        if req.mode == "race":
            return race_topk(q, req.noise_at_depth(depth), n), None
        return draft_sample(q, n, req.generator, without_replacement=True), q


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _match_chain(parents: Sequence[int], tokens: Sequence[int], want: Sequence[int]) -> list[int]:
    """Scratch rows of the longest root-anchored chain whose tokens spell a prefix of ``want``."""
    rows: list[int] = []
    cur = -1
    for t in want:
        nxt = next((i for i, p in enumerate(parents) if p == cur and i < len(tokens) and tokens[i] == t), None)
        if nxt is None:
            break
        rows.append(nxt)
        cur = nxt
    return rows
