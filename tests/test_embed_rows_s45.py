"""Session 45: the embedding's rows are gathered with index_select, never torch's advanced-indexing
kernel (``models.common.embed_rows``). That kernel opens an OpenMP region from a few rows on, and
the woken OpenMP team contended with the C passes' thread pool: a 6-row bf16 verify of SmolLM2 cost
1.8 ms more than a 5-row one (bench/results/2026-12-07-session45/). Oracle: ``table[ids]``."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.loading import load
from engine.models.common import embed_rows

from .tiny import saved


def test_embed_rows_equals_indexing():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        table = torch.randn(50, 12, generator=g).to(dtype)
        ids = torch.randint(0, 50, (7,), generator=g)
        assert torch.equal(embed_rows(table, ids), table[ids])
        assert torch.equal(embed_rows(table, ids.tolist()), table[ids])
        two = torch.randint(0, 50, (3, 5), generator=g)
        assert torch.equal(embed_rows(table, two), table[two])
        out = embed_rows(table, ids)
        out += 1  # a copy: the table is not written
        assert torch.equal(embed_rows(table, ids), table[ids])


class _Gathers(TorchDispatchMode):
    """Records the tensors aten.index.Tensor was applied to (their storage's address and shape)."""

    def __init__(self):
        super().__init__()
        self.indexed: list[tuple[int, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.index.Tensor:
            self.indexed.append((args[0].untyped_storage().data_ptr(), tuple(args[0].shape)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["llama", "gpt_neox", "mamba", "mamba2", "granite"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_passes_never_index_the_embedding(kind, dtype, tmp_path_factory):
    root = str(tmp_path_factory.getbasetemp() / "embed-rows")
    m = load(str(saved(kind, root)), dtype=dtype).model
    m.allocate(64)
    table = m.embed.untyped_storage().data_ptr()
    rec = _Gathers()
    with rec:
        m.prefill(list(range(1, 20)))
        m.verify(list(range(30, 38)), [-1, 0, 1, 2, 2, 4, 5, 0])  # a tree of 8 rows
        m.commit([0, 1, 2, 4, 5])
        m.verify([40], [-1])
    assert not [s for p, s in rec.indexed if p == table], f"{kind}: the embedding was gathered by advanced indexing"
