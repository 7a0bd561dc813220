"""KV cache with a committed prefix and a scratch tree on top (STYLE.md item 8: small verbs).

Rows [0, length) hold the committed tokens. Rows [length, length + scratch) hold scratch nodes:
tree nodes being verified or drafted, each attending to the whole committed prefix and to its own
ancestors among the scratch nodes (the tree mask, ALGORITHMS.md §1). Nothing in scratch is part of
the committed state until ``commit(rows)`` moves the accepted nodes' K/V down into contiguous
slots after the prefix; everything else is dropped.

Verbs:  allocate (constructor) · extend_plan (place new scratch nodes) · commit(rows) ·
        rollback(n) · reset(). The scratch-tree bookkeeping (ScratchCache) is shared with the
        recurrent-state caches of engine/ssm_cache.py.
"""

from __future__ import annotations

from typing import Sequence

import torch


def index_to(idx: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host index on ``device``, copied once: indexing CUDA tensors with a host index copies it
    and waits for the copy at every use (5 per Mamba-2 layer in a commit: 320 stalls of a 64-layer
    model, seen on an H200), while from pinned memory the one copy is queued without a wait
    (Snakes and Ladders §3.3: indices stay on the device)."""
    device = torch.device(device)
    if idx.device == device:
        return idx
    if device.type == "cuda":
        return idx.pin_memory().to(device, non_blocking=True)
    return idx.to(device)


class ScratchCache:
    """What every cache shares: the committed length and the scratch tree on top of it.

    Scratch node i hangs off ``scratch_parents[i]`` (a scratch index; -1 = the end of the committed
    prefix) at ``scratch_depth[i]`` (1 for children of the prefix); ``anc[i, j]`` says that node j
    is node i or one of its ancestors (the tree mask, ALGORITHMS.md §1). KVCache and the recurrent
    caches of engine/ssm_cache.py add their state and their commit/rollback rules.
    """

    prefix_rollback = True  # any committed prefix can be kept (an SSM state cannot: see ssm_cache)

    def __init__(self, capacity: int, max_scratch: int = 512):
        self.capacity = capacity
        self.max_scratch = max_scratch
        self.length = 0  # committed rows
        self.scratch_parents: list[int] = []  # parent scratch index per scratch node, -1 = prefix end
        self.scratch_depth: list[int] = []
        self._anc = torch.zeros(max_scratch, max_scratch, dtype=torch.bool)

    # ---- sizes ----------------------------------------------------------------------------------
    @property
    def scratch(self) -> int:
        return len(self.scratch_parents)

    def room(self) -> int:
        """Rows still free for scratch nodes or new committed tokens."""
        return self.capacity - self.length - self.scratch

    # ---- placing new nodes --------------------------------------------------------------------------
    @torch.inference_mode()  # the buffers may have been made inside it (CausalLM.full_logits allocates there)
    def place(self, parents: Sequence[int]) -> int:
        """Append T scratch nodes with the given parents (scratch indices; -1 = after the prefix,
        and a parent may be one of the nodes added in this same call, given in order): their
        parents, depths and ancestor rows. Checks everything before changing anything; returns
        the index of the first new node."""
        T, s0 = len(parents), self.scratch
        if T == 0:
            raise ValueError("extend with no nodes")
        if s0 + T > self.max_scratch:
            raise ValueError(f"draft tree too large: {s0 + T} scratch nodes (limit {self.max_scratch})")
        if self.length + s0 + T > self.capacity:
            raise OverflowError("context full")
        if any(not -1 <= p < s0 + i for i, p in enumerate(parents)):
            raise ValueError("scratch parents must precede their children")
        for i, p in enumerate(parents):
            idx = s0 + i
            if p >= 0:
                self._anc[idx] = self._anc[p]
                self.scratch_depth.append(self.scratch_depth[p] + 1)
            else:
                self._anc[idx].zero_()
                self.scratch_depth.append(1)
            self._anc[idx, idx] = True
            self.scratch_parents.append(int(p))
        return s0

    def clear_scratch(self) -> None:
        self.scratch_parents.clear()
        self.scratch_depth.clear()


class KVCache(ScratchCache):
    """Preallocated K/V for every layer: k[layer] is (K, P, E) with P = capacity rows."""

    def __init__(self, n_layers: int, n_kv: int, head_dim: int, capacity: int, dtype: torch.dtype, max_scratch: int = 512):
        super().__init__(capacity, max_scratch)
        self.k = torch.zeros(n_layers, n_kv, capacity, head_dim, dtype=dtype)
        self.v = torch.zeros(n_layers, n_kv, capacity, head_dim, dtype=dtype)
        # Mask rows are cut from this buffer: True over the committed prefix, tree mask after it.
        self._mask = torch.ones(max_scratch, capacity, dtype=torch.bool)

    def extend_plan(self, parents: Sequence[int]) -> tuple[int, torch.Tensor, torch.Tensor | None]:
        """Place T scratch nodes (``place``) and plan their forward.

        Returns (start row, positions (T,), mask (T, start + T) or None when every new row may see
        every row — the plain decoding case). Positions are length + depth - 1.
        """
        T = len(parents)
        s0 = self.place(parents)
        start = self.length + s0
        depth = self.scratch_depth[s0:]
        positions = torch.tensor(depth, dtype=torch.long) + (self.length - 1)
        if s0 == 0 and T == 1:
            return start, positions, None
        end = start + T
        mask = self._mask[:T, :end]
        mask[:, self.length:end] = self._anc[s0:s0 + T, : s0 + T]
        return start, positions, mask

    def release_mask(self, T: int, end: int) -> None:
        """Restore the mask buffer's committed-prefix invariant (all True) after a forward."""
        self._mask[:T, self.length:end] = True

    # ---- verbs ------------------------------------------------------------------------------------------
    def commit(self, rows: Sequence[int]) -> None:
        """Keep the scratch nodes ``rows`` (a root-to-node chain, in order) as committed tokens,
        compacted to rows [length, length + len(rows)); drop all other scratch nodes."""
        m = len(rows)
        if m:
            if list(rows) != list(range(m)):  # identity: K/V already in place (plain decoding, chains)
                src = index_to(torch.tensor(rows, dtype=torch.long) + self.length, self.k.device)
                # Indexing copies first, so overlapping source/destination rows are safe.
                self.k[:, :, self.length:self.length + m] = self.k[:, :, src]
                self.v[:, :, self.length:self.length + m] = self.v[:, :, src]
            self.length += m
        self.clear_scratch()

    def rollback(self, length: int) -> None:
        """Forget committed tokens after ``length`` (e.g. regenerate, or a new prompt that shares
        only a prefix with the cached one)."""
        if length < 0 or length > self.length:
            raise ValueError("rollback beyond the committed prefix")
        self.length = length
        self.clear_scratch()

    def reset(self) -> None:
        self.rollback(0)

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
