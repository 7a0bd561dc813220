"""Recurrent-state caches (Mamba-1, Mamba-2, the Mamba layers of Granite-4.0-H) and the draft
batches that recurrent drafters fork from them.

RecurrentCache = the scratch tree of engine/cache.py + a committed state + the activations of the
scratch nodes, which commit replays along the accepted chain (Snakes and Ladders §3.1 "Activation
Replay"). A recurrence cannot be rewound, so rollback(n) reaches only n == 0 (reset),
n == length, or back into the last commit (the state before it is kept and the first rows of that
commit are replayed again); prefix_rollback is False, and generate.Decoder.start and ModelDrafter
rebuild from 0 otherwise. A family supplies the state: ``_zero_state``, ``_advance_state`` and
``_restore_state``.

DraftBatch = B rows of a recurrent drafter's state for tree drafting (mamba-drafters §4.1,
ALGORITHMS.md §4): ``model.fork(n)`` copies the committed state into n rows, ``batch.step(tokens)``
advances every row by one token in one batched pass, ``batch.fork(parent_rows)`` gathers rows
into the next depth's batch (children copy their parent's state). The committed state is never
touched. Buffers come from a DraftPool, one set per (depth, rows), allocated on first use and
reused by every later draft of the same shape (the paper's per-B_i state caches).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from engine.kernels import use_triton

from .cache import ScratchCache, index_to

Acts = dict[str, torch.Tensor]  # one layer's cached activations of some nodes, rows first


def take(acts: list[Acts], rows: torch.Tensor | slice) -> list[Acts]:
    """The rows ``rows`` of every layer's activations."""
    return [{k: v[rows] for k, v in a.items()} for a in acts]


class RecurrentCache(ScratchCache):
    """Committed recurrent state + scratch activations; verbs as KVCache (STYLE.md item 8):
    place (ScratchCache) · store · commit(rows) · advance · rollback(n) · reset · clear_scratch.
    The mutating verbs run under inference_mode: the buffers may have been made inside it
    (CausalLM.full_logits allocates there), and in-place writes to those need it."""

    prefix_rollback = False  # only n == 0, n == length or inside the last commit (module docstring)

    def __init__(self, n_layers: int, capacity: int, max_scratch: int = 512):
        super().__init__(capacity, max_scratch)
        self.acts: list[Acts | None] = [None] * n_layers  # per layer, rows = scratch nodes
        # the CUDA graph whose static output buffers ``acts`` are (a graphed verify pass), else
        # None: a commit can then be replayed from a graph too (its inputs keep their addresses)
        self.acts_key: Any = None
        self._undo: tuple[int, list[Acts]] | None = None  # (length before, replayed rows) of the last commit
        self.draft_pool = DraftPool()

    # ---- the family's state -------------------------------------------------------------------
    def _zero_state(self) -> None:
        raise NotImplementedError

    def _advance_state(self, path: list[Acts], state: Any = None) -> None:
        """Make the state after the chain ``path`` (per layer, M rows) current — ``state`` when the
        caller computed it already, else replayed from the current one — keeping the current one
        for _restore_state."""
        raise NotImplementedError

    def _restore_state(self) -> None:
        """Make the state kept by the last _advance_state current again."""
        raise NotImplementedError

    # ---- scratch activations ------------------------------------------------------------------
    def store(self, layer: int, new: Acts) -> Acts:
        """Append the new nodes' activations of ``layer``; returns those of all scratch nodes."""
        old = self.acts[layer]
        self.acts[layer] = new if old is None else {k: torch.cat([old[k], v]) for k, v in new.items()}
        self.acts_key = None
        return self.acts[layer]

    def clear_scratch(self) -> None:
        super().clear_scratch()
        self.acts = [None] * len(self.acts)
        self.acts_key = None

    # ---- verbs ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def commit(self, rows: Sequence[int]) -> None:
        """Activation replay (snakes-and-ladders §3.1): the scratch nodes ``rows`` (a chain from a
        root child down, in order) become committed; every other scratch node is dropped."""
        rows = self.chain_rows(rows)
        if rows:
            self.advance(take(self.acts, self._on_device(rows)), len(rows))
        self.clear_scratch()

    def chain_rows(self, rows: Sequence[int]) -> list[int]:
        """``rows`` as ints, checked to be a chain of scratch nodes from a root child down."""
        rows = [int(r) for r in rows]
        for j, r in enumerate(rows):
            if not 0 <= r < self.scratch or self.scratch_parents[r] != (rows[j - 1] if j else -1):
                raise ValueError(f"commit rows {rows} are not a root-to-node chain of the {self.scratch} scratch nodes")
        return rows

    def _on_device(self, rows: list[int]) -> torch.Tensor:
        """``rows`` as an index on the activations' device (cache.index_to), once for every layer
        and tensor."""
        idx = torch.tensor(rows, dtype=torch.long)
        return index_to(idx, next((v.device for a in self.acts if a is not None for v in a.values()), idx.device))

    @torch.inference_mode()
    def advance(self, path: list[Acts], m: int, state: Any = None) -> None:
        """Commit the m-row chain ``path`` (per layer activations): the state after it becomes
        the committed state; the state before and ``path`` stay for rollback into this commit."""
        self._advance_state(path, state)
        self._undo = (self.length, path)
        self.length += m

    @torch.inference_mode()
    def rollback(self, length: int) -> None:
        """Keep the first ``length`` committed tokens: possible for length == self.length, 0, or
        inside the last commit. Anything else raises ValueError: reset and prefill again."""
        self.clear_scratch()
        if length == self.length:
            return
        if length == 0:
            return self.reset()
        start = self._undo[0] if self._undo is not None else self.length
        if not start <= length < self.length:
            raise ValueError(
                f"cannot roll back a recurrent state to {length} of {self.length} committed tokens: it rewinds only to 0, "
                f"{self.length}, or within the last commit (>= {start}); reset and prefill again")
        path = self._undo[1]
        self._restore_state()
        self.length, self._undo = start, None
        m = length - start
        if m:
            self.advance(take(path, slice(0, m)), m)

    @torch.inference_mode()
    def reset(self) -> None:
        self._zero_state()
        self.length = 0
        self._undo = None
        self.clear_scratch()


# ---------------------------------------------------------------------------------------------
# Tree drafting with a recurrent drafter (mamba-drafters §4.1)
# ---------------------------------------------------------------------------------------------
class DraftPool:
    """State buffers of draft batches, one set per (depth, rows): mamba-drafters §4.1 allocates a
    state cache per batch size B_i = N_1·…·N_i in advance and reuses it for every draft. Here a
    set is allocated the first time a (depth, B) is asked for and handed out again after."""

    def __init__(self) -> None:
        self._sets: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.high: dict[str, int] = {}  # high-water marks of growable buffers (KV tails)

    def take(self, depth: int, rows: int, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Buffers shaped like ``like`` (row axis 1) with ``rows`` rows, for batches at ``depth``."""
        have = self._sets.setdefault((depth, rows), {})
        out = {}
        for k, t in like.items():
            shape = (t.shape[0], rows, *t.shape[2:])
            b = have.get(k)
            if b is None or b.shape != shape or b.dtype != t.dtype or b.device != t.device:
                b = have[k] = torch.empty(shape, dtype=t.dtype, device=t.device)
            out[k] = b
        return out

    def put(self, depth: int, rows: int, name: str, buf: torch.Tensor) -> None:
        self._sets.setdefault((depth, rows), {})[name] = buf


class DraftBatch:
    """B rows of a recurrent drafter's state, one per tree node of one depth (mamba-drafters §4.1).

    state: name -> tensor with layers on axis 0 and rows on axis 1 (e.g. conv (L, B, ...), ssm
    (L, B, ...); a hybrid adds per-row K/V tails). ``start`` is the committed length the rows
    grew from and ``steps`` the tokens each row has taken since; the next token of every row is
    at position start + steps.

        step(tokens)        LongTensor[B] -> logits (B, V); every row advances by its token, in
                            place, in one batched pass
        fork(parent_rows)   LongTensor[B2] -> a new DraftBatch whose row j copies row
                            parent_rows[j] (a gather on the state's device, no host sync: the
                            Triton state_gather on CUDA, index_select elsewhere)

    Buffers are the pool's for (depth, B): a batch stays valid until the next fork to the same
    depth and size (the next draft) or a change of the committed state it was forked from.
    """

    def __init__(self, model: Any, pool: DraftPool, depth: int, rows: int, state: dict[str, torch.Tensor], start: int, steps: int = 0):
        self.model, self.pool, self.depth, self.rows = model, pool, depth, rows
        self.state, self.start, self.steps = state, start, steps

    @classmethod
    @torch.inference_mode()
    def of_committed(cls, model: Any, pool: DraftPool, n: int, committed: dict[str, torch.Tensor], start: int,
                     scratch: dict[str, torch.Tensor] | None = None) -> "DraftBatch":
        """n rows, each a copy of the committed state (``committed``: tensors with a row axis of
        size 1 at dim 1, broadcast into the rows); ``scratch`` tensors (same layout) only shape
        buffers that the rows fill as they step (a hybrid's K/V tails)."""
        if n < 1:
            raise ValueError(f"fork needs at least one row, not {n}")
        state = pool.take(0, n, {**committed, **(scratch or {})})
        for k, t in committed.items():
            state[k].copy_(t.expand_as(state[k]))
        return cls(model, pool, 0, n, state, start)

    @property
    def position(self) -> int:
        return self.start + self.steps

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """Advance every row by its token (LongTensor[B]); returns the logits (B, V) after it."""
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        if tokens.shape != (self.rows,):
            raise ValueError(f"step needs one token per row: {self.rows} rows, tokens of shape {tuple(tokens.shape)}")
        logits = self.model._step_batch(self, tokens)
        self.steps += 1
        return logits

    @torch.inference_mode()
    def fork(self, parent_rows: torch.Tensor | Sequence[int]) -> "DraftBatch":
        """A batch of len(parent_rows) rows, row j a copy of this batch's row parent_rows[j]."""
        idx = torch.as_tensor(parent_rows, dtype=torch.long)
        if idx.dim() != 1 or idx.numel() == 0:
            raise ValueError(f"fork needs a non-empty 1-d LongTensor of parent rows, not shape {tuple(idx.shape)}")
        n = idx.numel()
        state = self.pool.take(self.depth + 1, n, self.state)
        idx = index_to(idx, next(iter(self.state.values())).device)  # once for every state tensor
        for k, t in self.state.items():
            if use_triton(t):
                from engine.kernels.state_gather import state_gather

                state_gather(t, idx, out=state[k])
            else:
                torch.index_select(t, 1, idx, out=state[k])
        return DraftBatch(self.model, self.pool, self.depth + 1, n, state, self.start, self.steps)

    def grow(self, name: str, dim: int, size: int) -> torch.Tensor:
        """state[name] with room for ``size`` entries along ``dim`` (doubling; the pool keeps the
        grown buffer for later drafts, so a draft of the same depth never grows it again)."""
        t = self.state[name]
        if t.shape[dim] >= size:
            return t
        shape = list(t.shape)
        shape[dim] = max(size, 2 * shape[dim])
        new = t.new_empty(shape)
        new.narrow(dim, 0, t.shape[dim]).copy_(t)
        self.state[name] = new
        self.pool.put(self.depth, self.rows, name, new)
        self.pool.high[name] = max(self.pool.high.get(name, 0), shape[dim])
        return new
