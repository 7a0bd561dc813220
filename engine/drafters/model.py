"""Model drafter: any engine model (same tokenizer as the target) drafts chains or static trees,
depth by depth, one forward per depth:

* transformer drafters extend a scratch tree in their cache, every node attending to the
  committed prefix and its ancestors (tree attention, ALGORITHMS.md §1);
* recurrent drafters (models with ``fork``: Mamba-1, Mamba-2, Granite-4.0-H) fork the committed
  state into one row per node and step all rows of a depth in one batched pass, children copying
  their parent's row (mamba-drafters §4.1, ALGORITHMS.md §4; engine/ssm_cache.DraftBatch).

Drafter numerics (models/common.fast_rows): the drafter's single-row products may take a faster
GEMV whose bits differ from the same row in a multi-row product; verification decides what is
emitted, and a sampled draft's q is recorded as drafted, so this never touches losslessness.

The drafter keeps its own cache in step with the conversation: on each ``propose`` it commits what
the target accepted — a transformer reuses the K/V of draft nodes it already computed on the
accepted path — and only runs the tokens it has not seen (usually just the target's
correction/bonus token).
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from ..models.base import CausalLM
from ..models.common import drafter_numerics
from ..sampling import draft_sample, probs_from_logits, race_topk
from ..tree import TokenTree
from .base import DraftRequest


# up to this many new tokens, a recurrent drafter steps them (advance_fast) rather than prefilling.
# Since the C blocks take every catch-up token in one call (projections over all of them at once),
# that is faster at every length measured: the shipped drafter 0.86 / 5.5 / 22 / 56 ms for 8 / 80 /
# 400 / 1000 tokens against a torch prefill + verify pass's 8.3 / 19.3 / 48 / 116 (2-core Zen 4, bf16
# target; bench/results/2026-11-27-session29 section 3). It was 40 while the C path stepped one
# token a call: hybrid:auto's drafter, left out for 32+ steps, then caught up ~80 tokens in torch.
FAST_ADVANCE_MAX = 1 << 30


class ModelDrafter:
    name = "model"
    supports_confidence = True  # DraftRequest.confidence: greedy chains record p and stop early

    def __init__(self, model: CausalLM, target_vocab: int, label: str = "model", draft_vocab: torch.Tensor | None = None):
        self.target_vocab = target_vocab
        self.draft_vocab = None
        if draft_vocab is not None and getattr(model, "lm_head_t", None) is not None:
            # A draft vocabulary (the tokens the drafter was trained to propose, FR-Spec-like): the
            # output layer shrinks to those columns, the rest of the target's vocabulary is never
            # proposed. Lossless: verification never depends on which tokens were proposed, and q
            # is still a distribution over the target's vocabulary (zero outside the list).
            model = model.with_own_cache()
            from ..models.common import take_cols

            model.lm_head_t = take_cols(model.lm_head_t, draft_vocab)
            self.draft_vocab = draft_vocab
        self.model = model
        self._cols: torch.Tensor | None = None  # restrict(): the output columns proposals may use
        self._col_ids: torch.Tensor | None = self.draft_vocab  # the token id of each usable column (None: the column index)
        self.label = label
        self.model.allocate()
        self.seen: list[int] = []  # tokens committed in the drafter's cache
        self._scratch_tokens: list[int] = []  # token of each scratch node (index = scratch row)
        self._root_logits: torch.Tensor | None = None
        self.step_ms = 0.0  # a Spine step's recent cost (ms, EMA)
        self.caught_up = 0  # tokens the last _sync ran the drafter over
        self.sync_ms = 0.0  # and what that took (propose's catch-up: the decoder books it apart)

    def restrict(self, ids: torch.Tensor | None) -> None:
        """Propose only tokens in ``ids`` (None: every token): q is renormalised over them. The
        TLI bridge (engine/drafters/vocab.py) restricts a drafter to the vocabularies'
        intersection this way."""
        if ids is None:
            self._cols, self._col_ids = None, self.draft_vocab
            return
        n = min(self.model.vocab_size, self.target_vocab) if self.draft_vocab is None else len(self.draft_vocab)
        have = self.draft_vocab if self.draft_vocab is not None else torch.arange(n)
        cols = torch.nonzero(torch.isin(have, ids.to(have.dtype))).flatten()
        self._cols, self._col_ids = cols, have[cols]

    def reset(self) -> None:
        self.model.cache.reset()
        self.seen = []
        self._scratch_tokens = []
        self._root_logits = None

    @property
    def recurrent(self) -> bool:
        """Drafts by fork/step (a recurrent state) rather than by extending a scratch tree."""
        return hasattr(self.model, "fork")

    # ---- keeping in step with the conversation --------------------------------------------------------
    @torch.inference_mode()
    @drafter_numerics
    def _sync(self, history: Sequence[int]) -> torch.Tensor:
        """Bring the drafter's committed prefix to ``history`` (root included); return the logits
        that predict the token after the root."""
        history = list(history)
        cache = self.model.cache
        n = _common_prefix(self.seen, history)
        if n == len(self.seen) == len(history) and self._root_logits is not None:
            cache.clear_scratch()  # asked again for the same position: draft afresh
            self._scratch_tokens = []
            self.caught_up = 0
            return self._root_logits
        n = min(n, len(history) - 1)
        if n < len(self.seen):
            if n != cache.length and not getattr(cache, "prefix_rollback", False):
                n = _recurrent_rollback(cache, n)
            else:
                cache.rollback(n)
            del self.seen[n:]
        elif not self.recurrent:
            # Reuse draft nodes on the accepted path: their K/V are in scratch already.
            rows = _match_chain(cache.scratch_parents, self._scratch_tokens, history[n:len(history) - 1])
            cache.commit(rows)
            self.seen.extend(history[n:n + len(rows)])
        self._scratch_tokens = []
        rest = history[len(self.seen):]
        embed = getattr(self.model, "embed", None)  # (rows, D): the input rows (a draft vocabulary cuts the head only)
        V = int(embed.shape[0]) if isinstance(embed, torch.Tensor) else self.target_vocab
        if V < self.target_vocab:
            # a target whose embedding has padding rows the drafter lacks (Qwen2.5-7B's 152064 beside
            # 0.5B's 151936, one tokenizer) can sample one of them: the drafter reads it as id 0, which
            # only makes its next drafts worse (the target verifies them); its index was an IndexError
            rest = [t if t < V else 0 for t in rest]
        self.caught_up = len(rest)  # tokens this call ran the drafter over (Spine: what catching up cost)
        room = cache.capacity - cache.length
        if len(rest) > room:
            raise OverflowError("drafter context full")
        fast = getattr(self.model, "advance_fast", None)  # a recurrent drafter's C step, a few tokens at a time
        logits = fast(rest) if fast is not None and len(rest) <= FAST_ADVANCE_MAX else None
        if logits is None:
            if len(rest) > 1:
                self.model.prefill(rest[:-1])
            logits = self.model.verify([rest[-1]], [-1])[-1]
            cache.commit([0])
        self.seen = history
        self._root_logits = self._raw(logits)
        return self._root_logits

    def _raw(self, logits: torch.Tensor) -> torch.Tensor:
        """The drafter's logits in its own output space (the draft vocabulary's columns, or the
        target's ids with padding columns beyond the target's vocabulary cut)."""
        logits = logits.float()
        if self.draft_vocab is None and logits.shape[-1] > self.target_vocab:
            return logits[..., : self.target_vocab]
        return logits

    def _view(self, raw: torch.Tensor) -> torch.Tensor:
        """``raw`` cut to the columns ``restrict`` allows."""
        return raw if self._cols is None else raw[..., self._cols]

    def _top(self, raw: torch.Tensor, k: int) -> list[list[int]]:
        """Top-k target token ids of every row of ``raw`` (a ``_view``), best first (one batched topk)."""
        idx = torch.topk(raw, min(k, raw.shape[-1]), dim=-1).indices
        if self._col_ids is not None:
            idx = self._col_ids[idx]
        return idx.tolist()

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary: drafter rows beyond it (padding) and tokens outside
        the draft vocabulary can never be proposed."""
        V = self.target_vocab
        logits = logits.float()
        if self._col_ids is not None:
            full = torch.full((*logits.shape[:-1], V), float("-inf"))
            full[..., self._col_ids] = logits
            return full
        if logits.shape[-1] > V:
            return logits[..., :V]
        if logits.shape[-1] < V:
            pad = torch.full((*logits.shape[:-1], V - logits.shape[-1]), float("-inf"))
            return torch.cat([logits, pad], dim=-1)
        return logits

    # ---- drafting ----------------------------------------------------------------------------------------------
    @torch.inference_mode()
    @drafter_numerics
    def propose(self, history: Sequence[int], req: DraftRequest) -> TokenTree:
        """A tree of ``req.shape`` grown depth by depth: every node of depth d gets up to N_(d+1)
        children chosen from its logits, then one forward over all new nodes gives theirs."""
        t0 = time.perf_counter()
        root_logits = self._sync(history)
        self.sync_ms = (time.perf_counter() - t0) * 1000.0
        cache = self.model.cache
        kids = _plan_children(req)
        tokens: list[int] = []
        parents: list[int] = []
        q_rows: dict[int, torch.Tensor] = {}
        frontier: list[tuple[int, int]] = [(-1, -1)]  # (tree node, plan node) of the current depth (-1 = root)
        logits = self._view(root_logits[None])  # (F, V): row f predicts the children of frontier[f]
        budget = min(req.max_nodes, cache.capacity - cache.length - 1)
        batch = None  # recurrent drafters: the DraftBatch whose row f is frontier[f]'s state
        srows: list[int] = [-1]  # transformer drafters: the scratch row of each frontier node
        d = 0
        greedy = req.mode == "greedy" or req.temperature <= 0
        # a greedy chain's confidence (engine/gate.py): the drafter's probability of each token it
        # drafts, the softmax maximum of its row (the chosen token is the row's argmax)
        chain = all(len(v) <= 1 for v in kids.values())
        conf_on = req.confidence and greedy and chain
        if req.mode == "greedy" and self.recurrent and chain:
            fast = self._chain_fast(logits, kids, budget, req, conf_on)
            if fast is not None:
                return fast
        if req.mode == "sample" and not greedy and self.recurrent and chain:
            fast = self._chain_sampled_fast(logits, kids, budget, req)
            if fast is not None:
                return fast
        confidence: list[float] = []
        while frontier:
            new: list[int] = []  # the frontier index of each new node's parent
            plan_ids: list[int] = []
            top = self._top(logits, max(len(kids.get(pid, [])) for _, pid in frontier) or 1) if greedy else None
            for f, (node, pid) in enumerate(frontier):
                want = kids.get(pid, [])
                n = min(len(want), budget - len(tokens))
                if n <= 0:
                    continue
                if top is not None:
                    toks, q = top[f][:n], None
                else:
                    toks, q = self._choose(logits[f], n, d, req)
                if q is not None:
                    q_rows[node + 1] = q
                tokens.extend(toks)
                parents.extend([node] * len(toks))
                new.extend([f] * len(toks))
                plan_ids.extend(want[: len(toks)])  # fewer come back where q has fewer than n tokens left (top-p, a low T)
            if conf_on and new:
                confidence.append(float(torch.softmax(logits[new[0]].float(), -1).max()))
            if not new or len(tokens) >= budget:
                break
            if conf_on and req.keep_going is not None and not req.keep_going(confidence):
                break  # one more draft step could not pay: no need to run it
            nxt = [(len(tokens) - len(new) + j, pid) for j, pid in enumerate(plan_ids)]
            keep = [j for j, (_, pid) in enumerate(nxt) if pid in kids]  # only nodes with children step on
            if not keep:
                break
            new = [new[j] for j in keep]
            new_tokens = [tokens[nxt[j][0]] for j in keep]
            if self.recurrent:
                batch = self._fork(batch, new)
                out = batch.step(torch.tensor(new_tokens, dtype=torch.long))
            else:
                s0 = cache.scratch
                out = self.model.extend(new_tokens, [srows[f] for f in new])
                self._scratch_tokens.extend(new_tokens)
                srows = list(range(s0, s0 + len(new)))
            logits = self._view(self._raw(out))
            frontier = [nxt[j] for j in keep]
            d += 1
        kind = "deterministic"
        probs = None
        if req.mode == "sample":
            kind = "without_replacement" if any(len(v) > 1 for v in kids.values()) else "iid"
            probs = self._placed(q_rows, len(tokens))
        elif req.mode == "race":
            kind = "race"
        return TokenTree(tokens, parents, probs, kind, confidence=confidence if conf_on else [])

    def _step_fast(self, batch, token: int, k: int, want_p: bool):
        """``batch``'s row stepped by ``token`` in one C call (Mamba2.draft_step_fast) over this
        drafter's usable columns: (top-k ids, probabilities or None), or None where it does not apply."""
        step = getattr(self.model, "draft_step_fast", None)
        if step is None or not hasattr(self.model.lm_head_t, "shape"):
            return None
        V = self.model.lm_head_t.shape[1]
        width = V if self.draft_vocab is not None else min(V, self.target_vocab)  # _raw's columns
        k = min(k, width if self._cols is None else self._cols.numel())
        return step(batch, token, k, width, self._cols, self._col_ids, want_p=want_p)

    def _chain_fast(self, logits: torch.Tensor, kids: dict[int, list[int]], budget: int, req: DraftRequest,
                    conf_on: bool) -> TokenTree | None:
        """``propose``'s greedy chain with every step after the root's in C (Mamba2.draft_step_fast:
        block, head and top-1 in one call); the same tokens as the torch loop up to the drafter's
        numerics, the same early stop (``keep_going``). None where the C step does not apply."""
        tokens: list[int] = []
        confidence: list[float] = []
        tok = self._top(logits, 1)[0][0]
        p = float(torch.softmax(logits[0].float(), -1).max()) if conf_on else 0.0
        pid, batch = -1, None
        while True:
            want = kids.get(pid, [])
            if not want or len(tokens) >= budget:
                break
            tokens.append(tok)
            if conf_on:
                confidence.append(p)
            if len(tokens) >= budget or (conf_on and req.keep_going is not None and not req.keep_going(confidence)):
                break
            pid = want[0]
            if pid not in kids:
                break
            if batch is None:
                batch = self._fork(None, [0])
            out = self._step_fast(batch, tok, 1, want_p=conf_on)
            if out is None:
                if len(tokens) == 1:
                    return None  # not for this drafter: the torch loop drafts afresh
                raise RuntimeError("the drafter's C step stopped applying mid-chain")
            tok = out[0][0]
            p = out[1][0] if conf_on else 0.0
        return TokenTree(tokens, list(range(-1, len(tokens) - 1)), None, "deterministic",
                         confidence=confidence if conf_on else [])

    def _chain_sampled_fast(self, logits: torch.Tensor, kids: dict[int, list[int]], budget: int,
                            req: DraftRequest) -> TokenTree | None:
        """``propose``'s sampled chain with every step after the root's in C (Mamba2.draft_step_fast:
        the blocks and the head in one call, its logits left for the draw), each token drawn by
        ``_choose`` over the usable columns as the torch loop draws it (q: the distribution it was
        drawn from, whatever the C step's numerics). None where the C step does not apply."""
        tokens: list[int] = []
        q_rows: dict[int, torch.Tensor] = {}
        view = logits[0]
        pid, batch = -1, None
        while True:
            want = kids.get(pid, [])
            if not want or len(tokens) >= budget:
                break
            toks, q = self._choose(view, 1, len(tokens), req)
            if not toks:
                break
            q_rows[len(tokens)] = q  # (row convention: a node's children's q at its index + 1)
            tokens.append(toks[0])
            pid = want[0]
            if len(tokens) >= budget or pid not in kids:
                break
            if batch is None:
                batch = self._fork(None, [0])
            raw = self.model.draft_step_logits() if self._step_fast(batch, toks[0], 1, want_p=False) is not None else None
            if raw is None:
                if len(tokens) == 1:
                    return None  # not for this drafter: the torch loop drafts afresh (the draw is made again there)
                raise RuntimeError("the drafter's C step stopped applying mid-chain")
            view = self._view(self._raw(raw[None]))[0]
        return TokenTree(tokens, list(range(-1, len(tokens) - 1)), self._placed(q_rows, len(tokens)), "iid")

    def spine(self, history: Sequence[int], k: int = 3) -> "Spine":
        """A handle that steps this drafter along one path of a tree grown elsewhere (hybrid:auto's
        best-first tree, NgramDrafter.corpus_tree): the drafter's top-``k`` next tokens and
        probabilities at the path's end (``candidates``), one step per token the tree puts there
        (``advance``)."""
        return Spine(self, history, k)

    def _fork(self, batch, parent_rows: list[int]):
        """The next depth's DraftBatch (mamba-drafters §4.1): one row per new node, a copy of its
        parent's row; depth 1 forks the committed state. A row with exactly one child in place
        needs no copy: the batch steps on."""
        if batch is None:
            return self.model.fork(len(parent_rows))
        if parent_rows == list(range(batch.rows)):
            return batch
        return batch.fork(torch.tensor(parent_rows, dtype=torch.long))

    def _choose(self, view: torch.Tensor, n: int, depth: int, req: DraftRequest) -> tuple[list[int], torch.Tensor | None]:
        """``n`` children of a node from its row of ``_view`` logits (target token ids), and q over
        the usable columns (None where the verifier needs none). A sampled draw is made over those
        columns (8,192 for the shipped drafter, against the target's 49,152: the softmax, the cuts and
        the draw there; session 47); ``_placed`` puts q at their token ids, the distribution
        ``_fit_vocab``'s full row gives (its other entries are -inf, so 0).
        The race draws over the full row: its noise is keyed by token id."""
        if req.mode == "greedy" or req.temperature <= 0:
            return self._top(view[None], n)[0], None
        if req.mode == "race":
            q = probs_from_logits(self._fit_vocab(view), req.temperature, req.top_p, req.top_k, req.min_p)
            return race_topk(q, req.noise_at_depth(depth), n), None
        q = probs_from_logits(view.float(), req.temperature, req.top_p, req.top_k, req.min_p)
        picks = draft_sample(q, n, req.generator, without_replacement=True)
        return (self._col_ids[picks].tolist() if self._col_ids is not None else picks), q

    def _placed(self, q_rows: dict[int, torch.Tensor], T: int) -> torch.Tensor:
        """The tree's q (T + 1, target vocabulary): each row of ``q_rows`` (``_choose``'s, over the
        usable columns) placed at their token ids, 0 elsewhere; on the drafter's device."""
        device = next(iter(q_rows.values())).device if q_rows else None
        probs = torch.zeros(T + 1, self.target_vocab, device=device)
        for r, q in q_rows.items():
            if self._col_ids is not None:
                probs[r, self._col_ids] = q
            else:
                probs[r, : q.shape[-1]] = q
        return probs


class Spine:
    """A drafter model stepped along one path of a draft tree that another procedure grows (the
    greedy draft of hybrid:auto: the path the tree's best-first order takes through the drafter's,
    the datastore's and the context's proposals; engine/drafters/ngram.py). Recurrent drafters
    fork the committed state once and step one row; transformer drafters extend a scratch chain.
    ``ms`` is the drafter's recent milliseconds per step (what a step costs the gate)."""

    def __init__(self, drafter: ModelDrafter, history: Sequence[int], k: int = 3):
        self.d, self.k = drafter, k
        t0 = time.perf_counter()
        self.logits = drafter._view(drafter._sync(history)[None])
        # how far behind the drafter was and what catching up cost (the gate charges a steady-state share)
        self.synced, self.sync_ms = drafter.caught_up, (time.perf_counter() - t0) * 1000.0
        self.spent_ms = self.sync_ms  # all this drafter's work for the tree: catch-up, steps, candidates
        self.batch = None
        self.srow = -1  # transformer drafters: the scratch row of the path's end (-1: the root)
        cache = drafter.model.cache
        # steps the drafter can take: a recurrent state steps in place, a transformer's scratch fills
        self.room = 1 << 30 if drafter.recurrent else min(cache.capacity - cache.length - cache.scratch - 1,
                                                            cache.max_scratch - cache.scratch)
        self.steps = 0
        self._cands: list[tuple[int, float]] | None = None  # the C step's top k after the last advance

    @property
    def ms(self) -> float:
        return self.d.step_ms

    def candidates(self) -> list[tuple[int, float]]:
        """Up to k (target token id, drafter probability) pairs for the token after the path, best first."""
        if self._cands is not None:
            return list(self._cands)
        t0 = time.perf_counter()
        p, i = torch.softmax(self.logits[0].float(), -1).topk(min(self.k, self.logits.shape[-1]))
        ids = self.d._col_ids[i] if self.d._col_ids is not None else i
        out = list(zip(ids.tolist(), p.tolist()))
        self.spent_ms += (time.perf_counter() - t0) * 1000.0
        return out

    def can_advance(self) -> bool:
        return self.steps < self.room

    @torch.inference_mode()
    @drafter_numerics
    def advance(self, token: int) -> None:
        """Step the drafter with ``token``, the path's next node."""
        t0 = time.perf_counter()
        d = self.d
        if d.recurrent:
            self.batch = d._fork(self.batch, [0])
            fast = d._step_fast(self.batch, token, self.k, want_p=True)  # block, head and top k in one C call
            if fast is not None:
                self._cands, self.logits = list(zip(*fast)), None
            else:
                self.logits, self._cands = d._view(d._raw(self.batch.step(torch.tensor([token], dtype=torch.long)))), None
        else:
            s0 = d.model.cache.scratch
            out = d.model.extend([token], [self.srow])
            d._scratch_tokens.append(token)
            self.srow = s0
            self.logits, self._cands = d._view(d._raw(out)), None
        self.steps += 1
        ms = (time.perf_counter() - t0) * 1000.0
        self.spent_ms += ms
        d.step_ms = ms if d.step_ms == 0.0 else 0.8 * d.step_ms + 0.2 * ms


def _plan_children(req: DraftRequest) -> dict[int, list[int]]:
    """Plan node -> its children in rank order (-1 = the root), from ``req.plan`` or the shape."""
    from ..policy import plan_from_shape

    plan = req.plan if req.plan is not None else plan_from_shape(req.shape)
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(plan):
        kids.setdefault(p, []).append(i)
    return kids


def _recurrent_rollback(cache, n: int) -> int:
    """Roll a recurrent state back to ``n`` tokens where it can (inside its last commit), else
    to 0 (it is rebuilt by prefill); returns the length kept."""
    try:
        cache.rollback(n)
    except ValueError:
        cache.rollback(0)
        return 0
    return n


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
