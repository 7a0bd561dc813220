"""The Model contract shared by every family (DESIGN.md "The contracts that keep it simple").

    prefill(ids)                 commit a run of tokens (no logits: the last prompt token is fed later)
    verify(tokens, parents)      logits (T, V) of a packed tree on top of the committed prefix;
                                 the committed state is unchanged (nodes land in scratch)
    extend(tokens, parents)      add more scratch nodes (drafters grow trees depth by depth)
    commit(rows)                 scratch rows of the accepted chain become committed, compacted
    rollback(n)                  truncate the committed prefix
    fork(n) -> DraftBatch        recurrent families only: n copies of the committed state that
                                 draft by batched ``step(tokens) -> logits`` and ``fork(rows)``
                                 (mamba-drafters §4.1; engine/ssm_cache.py)

Row convention of verify: tokens[0] is the pending root token (parent -1); tokens[i] hangs off
parents[i] (a row index). Positions are committed_length + depth - 1 with the root at depth 1.
Attention families store K/V in engine.cache.KVCache; a family implements ``forward_rows``.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator, Sequence

import torch

from engine import kernels

from ..cache import KVCache


class CausalLM(torch.nn.Module):
    family: str = "?"
    _prefilling: bool = False  # inside prefill(): a family may take another path for long chunks (llama.py)
    # a list while a feature drafter listens (engine/drafters/feature.py): every pass's final-norm
    # hidden rows (T, D) are appended, prefill's and verify's (families whose passes run ``_run``)
    hidden_log: list | None = None

    def __init__(self) -> None:
        super().__init__()
        self.cache: KVCache | None = None
        self.max_context = 2048
        self._dtype = torch.float32
        self.lm_head_t: torch.Tensor | None = None  # (D, V)
        self.kv_dims: tuple[int, int, int] = (0, 0, 0)  # (layers, kv heads, head dim) of attention layers

    # ---- implemented by each family -------------------------------------------------------------
    def forward_rows(self, tokens: torch.Tensor, positions: torch.Tensor, start: int, mask: torch.Tensor | None) -> torch.Tensor:
        """Hidden states (T, D) after the final norm; writes K/V at cache rows [start, start+T)."""
        raise NotImplementedError

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(*self.kv_dims, capacity, self._dtype)

    @property
    def vocab_size(self) -> int:
        return self.lm_head_t.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the pass's tensors (activations, cache, logits)."""
        return self._dtype

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the model computes in, as the user asked for it: ``dtype``, except where the
        products run in another (the CPU bf16 compute type: bf16 products inside an fp32 pass,
        engine/models/llama.py ``keep_bf16``)."""
        return getattr(self, "_compute_dtype", None) or self._dtype

    def describe(self) -> dict[str, Any]:
        return {"family": self.family}

    # ---- the contract ---------------------------------------------------------------------------------
    def allocate(self, capacity: int | None = None) -> None:
        """(Re)allocate the cache for ``capacity`` rows (default: the model's context length)."""
        cap = min(capacity or self.max_context, self.max_context)
        if self.cache is None or self.cache.capacity != cap:
            self.cache = self.new_cache(cap)
        self.cache.reset()

    def with_own_cache(self) -> "CausalLM":
        """The same weights behind a separate cache (a model drafting for itself)."""
        clone = copy.copy(self)
        clone.cache = None
        clone.allocate()
        return clone

    @contextlib.contextmanager
    def logging_hidden(self, on: bool = True) -> Iterator[list | None]:
        """Inside, every pass's final-norm hidden rows are appended to the list yielded
        (``hidden_log``; ``on`` False: None, nothing kept)."""
        if not on:
            yield None
            return
        log = self.hidden_log = []
        try:
            yield log
        finally:
            self.hidden_log = None

    @property
    def length(self) -> int:
        return self.cache.length if self.cache is not None else 0

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], chunk: int = 256, backend: str | None = None) -> None:
        """Commit ``ids`` after the current prefix, in chunks (bounded attention-mask memory).
        A family with ``_prefill_dense`` (the SSM ones) sends a long prompt on CUDA through
        dense chunked kernels where kernels.long_prefill_backend says so (mamba_ssm installed
        and SPECCHAT_MAMBA_SSM=1); ``backend`` forces that ("ref": plain PyTorch, for tests)."""
        ids = list(ids)
        self.cache.clear_scratch()
        dense = getattr(self, "_prefill_dense", None)
        if backend is None and dense is not None:
            backend = kernels.long_prefill_backend(self.device, len(ids))
        if backend is not None and dense is None:
            raise ValueError(f"{type(self).__name__} has no dense prefill path")
        self._prefilling = True
        try:
            for s in range(0, len(ids), chunk):
                part = ids[s:s + chunk]
                if backend is not None:
                    dense(part, backend)
                    continue
                self._run(part, list(range(-1, len(part) - 1)), want_logits=False)
                self.cache.commit(range(len(part)))
        finally:
            self._prefilling = False

    @torch.inference_mode()
    def verify(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        self.cache.clear_scratch()
        return self._run(tokens, parents, want_logits=True)

    @torch.inference_mode()
    def extend(self, tokens: Sequence[int], parents: Sequence[int], want_logits: bool = True) -> torch.Tensor | None:
        return self._run(tokens, parents, want_logits)

    def commit(self, rows: Sequence[int]) -> None:
        self.cache.commit(rows)

    def rollback(self, length: int) -> None:
        self.cache.rollback(length)

    # ---- internals ------------------------------------------------------------------------------------------
    def _run(self, tokens: Sequence[int], parents: Sequence[int], want_logits: bool) -> torch.Tensor | None:
        cache = self.cache
        start, positions, mask = cache.extend_plan(parents)
        T = len(tokens)
        try:
            h = self.forward_rows(torch.as_tensor(tokens, dtype=torch.long), positions, start, mask)
        finally:
            if mask is not None:
                cache.release_mask(T, start + T)
        if self.hidden_log is not None:
            self.hidden_log.append(h)
        return self.logits(h) if want_logits else None

    @torch.inference_mode()
    def full_logits(self, ids: Sequence[int]) -> torch.Tensor:
        """Logits for every position of ``ids`` from an empty cache (tests and references)."""
        self.allocate(max(len(ids), 8))
        out = self.verify(ids, list(range(-1, len(ids) - 1)))
        self.cache.reset()
        return out
