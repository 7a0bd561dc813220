"""engine/native/llama_rows.c `attend_group_amx`: the C pass's attention over a bf16 KV cache on
AMX-BF16 tiles, where the CPU has them and the bf16 products run on AMX.

Its sums round as the tiles round them and the queries and softmax weights are rounded to bf16, so
its logits differ from the vector attention's (close, not equal); a row's bits must still not
depend on the pass it rides in (1-token steps, chunked prefill, tree verification with one or two
16-query tiles, contexts across several key blocks), which is what keeps every strategy lossless on
this path. On a CPU without AMX the path is off and these tests check that it says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from engine import native
from engine.loading import load
from .test_llama_rows import native_linear_on, root  # noqa: F401 (fixtures)
from .test_models import _random_tree, tree_walk
from .tiny import saved, sharpen

needs_native = pytest.mark.skipif(native.lib() is None, reason=f"native kernels {native.status()}")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _amx_here() -> bool:
    return native.lib() is not None and native.attention_path(64) == "amx"


needs_amx = pytest.mark.skipif(not _amx_here(), reason="attention on AMX tiles is off here (no AMX-BF16 or SPECCHAT_AMX_ATTN=0)")


@needs_native
def test_the_path_follows_the_products_and_the_head_size():
    """AMX attention runs where the bf16 products run on AMX (and only for head sizes that are a
    multiple of 32 up to 128); SPECCHAT_AMX_ATTN=0 and SPECCHAT_BF16_PATH=avx512 turn it off."""
    on = native.bf16_path() == "amx" and os.environ.get("SPECCHAT_AMX_ATTN") != "0"
    assert native.attention_path(64) == ("amx" if on else "vector")
    assert native.attention_path(128) == native.attention_path(64)
    for e in (48, 40, 256):
        assert native.attention_path(e) == "vector"
    child = "from engine import native; print(native.attention_path(64), native.bf16_path())"
    for env in ({"SPECCHAT_AMX_ATTN": "0"}, {"SPECCHAT_BF16_PATH": "avx512"}):
        r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=ROOT, **env))
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.split()[0] == "vector", (env, r.stdout)


def _llama(root: str, head_dim: int, heads: int, kv: int) -> str:
    """A tiny llama of another head size (tests/tiny.py's llama_hd64 is SmolLM2's shape)."""
    from pathlib import Path

    from transformers import LlamaConfig, LlamaForCausalLM

    if head_dim == 64:
        return str(saved("llama_hd64", root))
    path = Path(root) / f"llama_e{head_dim}"
    if not (path / "config.json").exists():
        cfg = LlamaConfig(vocab_size=96, hidden_size=head_dim * heads, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=512,
                          tie_word_embeddings=False)
        torch.manual_seed(0)
        sharpen(LlamaForCausalLM(cfg)).eval().save_pretrained(path)
    return str(path)


@needs_native
@needs_amx
@pytest.mark.parametrize("head_dim, heads, kv, ctx", [(64, 6, 2, 9), (64, 6, 2, 47), (64, 6, 2, 90),
                                                      (32, 4, 2, 47), (96, 2, 1, 47), (128, 2, 1, 90)])
def test_a_rows_bits_do_not_depend_on_its_pass(head_dim, heads, kv, ctx, root, native_linear_on, monkeypatch):
    """Head size 64 with 3 query heads a KV head (SmolLM2's shape): contexts of 9, 47 and 90 tokens
    put keys in one, three and six 16-key score blocks and one to three 32-key value blocks,
    partial ones included; trees of 14-20 rows put 24 queries in an item (two query tiles). Head
    sizes 32, 96 and 128: one, three and four 32-feature chunks, value sums in one 32-, a 64- and a
    32-, and two 64-feature halves. The logits stay close to the torch pass's over the same bf16
    cache (native rows off: torch's attention in fp32), within 0.5% of the largest logit."""
    m = load(_llama(root, head_dim, heads, kv)).model
    assert m._native_table() is not None and m.use_bf16_kv() and m.cfg.head_dim == head_dim
    assert native.attention_path(head_dim) == "amx"
    ids = torch.randint(0, 96, (ctx + 12,), generator=torch.Generator().manual_seed(ctx)).tolist()
    full = m.full_logits(ids)
    m.allocate()
    m.prefill(ids[:ctx], chunk=5)
    rows = []
    for t in ids[ctx:]:
        rows.append(m.verify([t], [-1])[0])
        m.commit([0])
    assert torch.equal(torch.stack(rows), full[ctx:])
    for seed in range(3):
        nodes, (got, ref), _ = tree_walk(m, ids[:ctx], _random_tree(14 + 3 * seed, 96, seed), nxt=7)
        for i, (a, b) in enumerate(nodes):
            assert torch.equal(a, b), (seed, i)
        assert torch.equal(got, ref)
    monkeypatch.setattr(native, "rows_enabled", lambda: False)
    t = load(_llama(root, head_dim, heads, kv)).model
    assert t._native_table() is None and t.use_bf16_kv()
    ref = t.full_logits(ids)
    assert (ref - full).abs().max() <= 0.005 * ref.abs().max(), (ref - full).abs().max()  # measured <= 0.0007


_CHILD = """
import json, sys, torch
from engine import native
from engine.loading import load
from engine.models import common
common._NATIVE_LINEAR = {"on": True, "why": "on (test)"}
m = load(sys.argv[1]).model
assert m.use_bf16_kv()
ids = torch.randint(0, 96, (150,), generator=torch.Generator().manual_seed(11)).tolist()
m.allocate()
m.prefill(ids[:100], chunk=7)
rows = []
for t in ids[100:]:
    rows.append(m.verify([t], [-1])[0].tolist())
    m.commit([0])
print(json.dumps({"path": native.attention_path(64), "rows": rows}))
"""


@needs_native
@needs_amx
def test_amx_attention_stays_close_to_the_vector_attention(root):
    """The same decode steps over 100-150 tokens of context on both paths (child processes: the
    path is read once per process): different bits, logits within bf16 rounding of each other."""
    path = str(saved("llama_hd64", root))
    outs = {}
    for flag in ("1", "0"):
        r = subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=ROOT, SPECCHAT_AMX_ATTN=flag))
        assert r.returncode == 0, r.stderr[-2000:]
        outs[flag] = json.loads(r.stdout.strip().splitlines()[-1])
    assert outs["1"]["path"] == "amx" and outs["0"]["path"] == "vector"
    a, b = torch.tensor(outs["1"]["rows"]), torch.tensor(outs["0"]["rows"])
    assert not torch.equal(a, b)
    assert (a - b).abs().max() <= 0.02 * b.abs().max(), (a - b).abs().max()
