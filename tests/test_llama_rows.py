"""engine/native/llama_rows.c: a whole fp32 llama pass in one C call.

It must equal transformers (fp32 rounding), and a row's bits must not depend on the pass it rides
in: one full forward, chunked prefill, 1-token decode steps and tree verification give every row
exactly the same logits (which is what makes speculative decoding lossless through it).
"""

from __future__ import annotations

import pytest
import torch

from engine import native
from engine.loading import load
from engine.models import common
from .test_models import _random_tree, tree_walk
from .tiny import saved

needs_native = pytest.mark.skipif(native.lib() is None, reason=f"native kernels {native.status()}")
KINDS = ["llama", "llama_tied", "qwen2", "llama3_rope", "mistral_window"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def native_linear_on(monkeypatch):
    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})


def _load(kind: str, root: str):
    m = load(str(saved(kind, root))).model
    assert m._native_table() is not None, "the fused pass should take this model"
    return m


@needs_native
@pytest.mark.parametrize("kind", KINDS)
def test_fused_pass_matches_transformers_and_the_torch_pass(kind, root, native_linear_on, monkeypatch):
    from transformers import AutoModelForCausalLM

    m = _load(kind, root)
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(1))
    out = m.full_logits(ids.tolist())
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(saved(kind, root)).eval()(ids[None]).logits[0]
    assert (ref - out).abs().max().item() <= 1e-4
    monkeypatch.setattr(native, "rows_enabled", lambda: False)
    torch_pass = load(str(saved(kind, root))).model
    assert torch_pass._native_table() is None
    assert (torch_pass.full_logits(ids.tolist()) - out).abs().max().item() <= 1e-4


@needs_native
@pytest.mark.parametrize("kind, kv16", [("llama", False), ("qwen2", False), ("llama_hd64", False), ("llama", True), ("llama_hd64", True)])
def test_a_rows_bits_do_not_depend_on_its_pass(kind, kv16, root, native_linear_on):
    """kv16: the bf16 KV cache the q8 compute type keeps (Llama.use_bf16_kv)."""
    m = _load(kind, root)
    if kv16:
        assert m.use_bf16_kv()
        m.allocate()
        assert m.cache.k.dtype == m.cache.v.dtype == torch.bfloat16
    ids = torch.randint(0, 96, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    full = m.full_logits(ids)
    m.allocate()
    m.prefill(ids[:11], chunk=4)
    rows = []
    for t in ids[11:]:
        rows.append(m.verify([t], [-1])[0])
        m.commit([0])
    assert torch.equal(torch.stack(rows), full[11:])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(m.with_own_cache().full_logits(ids), full)
    finally:
        torch.set_num_threads(threads)
    prefix = ids[:9]
    for seed in range(3):
        nodes, (got, ref), _ = tree_walk(m, prefix, _random_tree(14 + 2 * seed, 96, seed), nxt=7)  # 14-18 rows
        for i, (a, b) in enumerate(nodes):
            assert torch.equal(a, b), (seed, i)
        assert torch.equal(got, ref)


@needs_native
@pytest.mark.parametrize("kind", ["llama", "llama_hd64"])
def test_bf16_kv_cache_rounds_as_torch_and_stays_close(kind, root, native_linear_on, monkeypatch):
    """The C pass rounds new K/V rows to bf16 exactly as torch's cast does (layer 0's K/V do not
    depend on the cache, so they are the fp32 cache's values cast); the logits stay close to the fp32
    cache's, and the torch pass over a bf16 cache (SPECCHAT_NATIVE_ROWS=0) agrees with the C pass."""
    ids = torch.randint(0, 96, (37,), generator=torch.Generator().manual_seed(5)).tolist()
    ref = _load(kind, root)
    ref.allocate()
    ref.prefill(ids, chunk=8)
    m = _load(kind, root)
    assert m.use_bf16_kv()
    m.allocate()
    m.prefill(ids, chunk=8)
    n = len(ids)
    assert torch.equal(m.cache.k[0, :, :n], ref.cache.k[0, :, :n].to(torch.bfloat16))
    assert torch.equal(m.cache.v[0, :, :n], ref.cache.v[0, :, :n].to(torch.bfloat16))
    a, b = m.full_logits(ids), ref.full_logits(ids)
    assert not torch.equal(a, b) and (a - b).abs().max() <= 0.05 * b.abs().max()  # bf16: ~0.4% a value; random weights amplify
    monkeypatch.setattr(native, "rows_enabled", lambda: False)
    t = load(str(saved(kind, root))).model
    assert t._native_table() is None and t.use_bf16_kv()
    assert (t.full_logits(ids) - a).abs().max() <= 0.05 * a.abs().max()


@needs_native
def test_switch_off_keeps_the_torch_pass(root, native_linear_on, monkeypatch):
    monkeypatch.setenv("SPECCHAT_NATIVE_ROWS", "0")
    assert load(str(saved("llama", root))).model._native_table() is None


@needs_native
@pytest.mark.parametrize("kind, native_long, c_pass", [("llama", True, True), ("llama", False, False), ("llama_mha", True, False)])
def test_long_prefill_pass_and_decoding_stays_lossless(kind, native_long, c_pass, root, native_linear_on, monkeypatch):
    """A 119-row prefill chunk takes the C pass where its attention runs grouped (GQA) and
    llama.NATIVE_LONG_PREFILL is on, else the torch pass with its batched attention (multi-head
    attention: the C pass would stream every (row, head)'s keys alone); decode steps and verify
    passes stay in C either way, and every greedy strategy still equals plain greedy."""
    import engine.models.llama as llama_mod
    from engine.generate import Decoder, run_generation
    from engine.strategy import preset

    monkeypatch.setattr(llama_mod, "NATIVE_LONG_PREFILL", native_long)
    m = _load(kind, root)
    assert m._grouped() == (kind != "llama_mha")
    calls = []
    real = llama_mod.Llama._native_rows
    monkeypatch.setattr(llama_mod.Llama, "_native_rows", lambda self, tab, tokens, *a: calls.append(tokens.shape[0]) or real(self, tab, tokens, *a))
    prompt = torch.randint(0, 96, (120,), generator=torch.Generator().manual_seed(4)).tolist()
    dec = Decoder(m, load(str(saved("draft", root))).model)
    want, _ = run_generation(dec, prompt, preset("ar"), 24)
    assert calls and max(calls) == (119 if c_pass else 1)  # the prefill chunk's path; steps in C
    want = [t for e in want for t in e.emitted]
    for s in (preset("sd", draft_len=4), preset("tree", tree=(3, 2, 1)), preset("pld"), preset("sd", adaptive=True)):
        evs, _ = run_generation(dec, prompt, s, 24)
        assert [t for e in evs for t in e.emitted] == want, s.label()
    assert max(c for c in calls if c != 119) > 1  # verify passes ran in C


@needs_native
@pytest.mark.parametrize("kind, kv16", [("llama", False), ("llama", True), ("llama_hd64", True), ("qwen2", False)])
def test_a_long_prefill_chunks_rows_equal_one_token_steps(kind, kv16, root, native_linear_on):
    """A 90-row prefill chunk in the C pass writes K/V whose bits equal those of 1-token steps over
    the same tokens: the next steps' logits are the same bits either way."""
    import engine.models.llama as llama_mod

    ids = torch.randint(0, 96, (100,), generator=torch.Generator().manual_seed(9)).tolist()
    m = _load(kind, root)
    if kv16:
        assert m.use_bf16_kv()
    m.allocate()
    assert 90 > llama_mod.PREFILL_ROWS and m._grouped()

    def tail_logits(prefill: bool) -> torch.Tensor:
        m.rollback(0)
        if prefill:
            m.prefill(ids[:90], chunk=256)
        else:
            for t in ids[:90]:
                m.verify([t], [-1])
                m.commit([0])
        rows = []
        for t in ids[90:]:
            rows.append(m.verify([t], [-1])[0])
            m.commit([0])
        return torch.stack(rows)

    assert torch.equal(tail_logits(True), tail_logits(False))


@pytest.mark.parametrize("start, T, kv16", [(0, 150, False), (37, 130, False), (64, 64, True), (5, 200, True)])
def test_prefill_attention_equals_the_masked_attention(start, T, kv16):
    """common.prefill_attention (long fp32 prefill chunks: the mask as a bias folded into the score
    GEMM, rows in blocks over their own keys only) writes the same cache rows and gives the same
    outputs as cached_attention's explicit mask, to fp32 rounding; rows need not fill a block."""
    g = torch.Generator().manual_seed(start * 1000 + T)
    K, G, E = 2, 3, 16
    q, kn, vn = (torch.randn(n, T, E, generator=g) for n in (K * G, K, K))
    dtype = torch.bfloat16 if kv16 else torch.float32
    caches = [torch.randn(K, start + T + 9, E, generator=g).to(dtype) for _ in range(2)]
    mask = torch.ones(T, start + T, dtype=torch.bool)
    mask[:, start:] = torch.tril(torch.ones(T, T, dtype=torch.bool))
    k1, v1 = caches[0].clone(), caches[1].clone()
    k2, v2 = caches[0].clone(), caches[1].clone()
    want = common.cached_attention(q, kn, vn, k1, v1, start, mask, 0.25)
    got = common.prefill_attention(q, kn, vn, k2, v2, start, common.prefill_bias(mask, G), 0.25)
    assert torch.equal(k1, k2) and torch.equal(v1, v2)
    assert got.shape == want.shape == (T, K * G * E)
    assert (got - want).abs().max().item() <= 1e-5


@needs_native
@pytest.mark.parametrize("native_long", [True, False])
@pytest.mark.parametrize("kind", ["llama", "llama_hd64"])
def test_a_long_prefill_chunk_matches_transformers(kind, root, native_linear_on, monkeypatch, native_long):
    """A 119-row prefill chunk, in the C pass or (switched off) the torch pass's
    common.prefill_attention, leaves a cache whose next step's logits are transformers' for that
    position."""
    from transformers import AutoModelForCausalLM

    import engine.models.llama as llama_mod

    monkeypatch.setattr(llama_mod, "NATIVE_LONG_PREFILL", native_long)
    ids = torch.randint(0, 96, (120,), generator=torch.Generator().manual_seed(6)).tolist()
    assert len(ids) - 1 > llama_mod.PREFILL_ROWS
    m = _load(kind, root)
    m.allocate()
    m.prefill(ids[:-1])
    out = m.verify(ids[-1:], [-1])[0]
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(saved(kind, root)).eval()(torch.tensor([ids])).logits[0, -1]
    assert (ref - out).abs().max().item() <= 2e-4  # fp32 rounding (the same with the masked attention)
