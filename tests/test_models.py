"""Our model pages equal transformers on tiny random checkpoints; cached, tree and committed
decoding equal one full forward (STYLE.md item 6)."""

from __future__ import annotations

import pytest
import torch

from engine.loading import load
from engine.tree import TokenTree

from .tiny import TINY, saved

FAMILIES = [k for k in TINY if k not in ("draft", "long", "mamba", "mamba2", "granite")]  # SSMs: tests/test_mamba*.py


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("kind", FAMILIES)
def test_logits_match_transformers(kind, root):
    path = saved(kind, root)
    ours = load(str(path)).model
    from transformers import AutoModelForCausalLM

    ref_model = AutoModelForCausalLM.from_pretrained(path).eval()
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = ref_model(ids[None]).logits[0]
    out = ours.full_logits(ids.tolist())
    # fp32 rounding relative to the logits' size: two sums in different orders differ by ~1e-6 of
    # it (llama_hd64's logits reach ~15: 0.99e-4 and 1.02e-4 apart in two runs, the second under
    # load, against the absolute 1e-4 this used to be)
    assert (ref - out).abs().max().item() <= 2e-5 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("kind", ["llama", "gpt_neox", "qwen2"])
def test_cached_decoding_equals_full_forward(kind, root):
    m = load(str(saved(kind, root))).model
    ids = torch.randint(0, 96, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    full = m.full_logits(ids)
    m.allocate()
    m.prefill(ids[:11])  # chunked prefill path too
    rows = []
    for t in ids[11:]:
        rows.append(m.verify([t], [-1])[0])
        m.commit([0])
    assert (torch.stack(rows) - full[11:]).abs().max().item() <= 1e-4
    # prefill in small chunks equals one chunk
    m.allocate()
    m.prefill(ids[:-1], chunk=7)
    assert (m.verify([ids[-1]], [-1])[0] - full[-1]).abs().max().item() <= 1e-4


def _random_tree(n: int, vocab: int, seed: int) -> TokenTree:
    g = torch.Generator().manual_seed(seed)
    parents = [-1]
    for i in range(1, n):
        parents.append(int(torch.randint(-1, i, (1,), generator=g)))
    tokens = torch.randint(0, vocab, (n,), generator=g).tolist()
    return TokenTree(tokens, parents)


def tree_walk(m, prefix: list[int], tree: TokenTree, nxt: int):
    """Verify ``tree`` after ``prefix``, commit its deepest path, then decode ``nxt``. Returns the
    (tree logits, full-forward reference) pair of every node, the same pair for the step after the
    commit, and the committed path."""
    m.allocate()
    m.prefill(prefix[:-1])
    tokens, parents = tree.packed(prefix[-1])
    logits = m.verify(tokens, parents)
    nodes = [(logits[i + 1], m.with_own_cache().full_logits(prefix + tree.path_tokens(tree.path_to(i)))[-1])
             for i in range(len(tree))]
    path = tree.path_to(max(range(len(tree)), key=lambda i: tree.depth[i]))
    m.commit([0] + [i + 1 for i in path])
    got = m.verify([nxt], [-1])[0]
    return nodes, (got, m.with_own_cache().full_logits(prefix + tree.path_tokens(path) + [nxt])[-1]), path


@pytest.mark.parametrize("kind", ["llama", "gpt_neox"])
def test_tree_verify_and_commit_equal_path_forward(kind, root):
    """Each tree node's logits equal a full forward of prefix + its path; committing a path keeps
    exactly that path's K/V (compaction), so decoding continues as if only the path was fed."""
    m = load(str(saved(kind, root))).model
    prefix = torch.randint(0, 96, (9,), generator=torch.Generator().manual_seed(3)).tolist()
    for seed in range(4):
        nodes, (got, ref), path = tree_walk(m, prefix, _random_tree(12, 96, seed), nxt=5)
        for a, b in nodes:
            assert (a - b).abs().max().item() <= 1e-4
        assert m.length == len(prefix) + len(path)
        assert (got - ref).abs().max().item() <= 1e-4


def test_rollback_then_continue(root):
    m = load(str(saved("llama", root))).model
    ids = list(range(3, 23))
    full = m.full_logits(ids)
    m.allocate()
    m.prefill(ids[:15])
    m.rollback(8)
    m.prefill(ids[8:-1])
    assert (m.verify([ids[-1]], [-1])[0] - full[-1]).abs().max().item() <= 1e-4


def test_bf16_runs_and_is_close(root):
    m32 = load(str(saved("llama", root))).model
    m16 = load(str(saved("llama", root)), dtype="bf16").model
    ids = list(range(1, 20))
    a, b = m32.full_logits(ids), m16.full_logits(ids).float()
    assert b.dtype == torch.float32 and (a - b).abs().max().item() < 0.5


@pytest.mark.parametrize("kind, limit", [("dynamic_rope", 64), ("mistral_window", 48)])
def test_context_capped_where_reference_semantics_change(kind, limit, root):
    """Dynamic-NTK RoPE and sliding windows change the model past a length; we cap the context
    there (and match transformers below it, see test_logits_match_transformers)."""
    m = load(str(saved(kind, root))).model
    assert m.max_context == limit


def test_bf16_single_row_matmul_matches_multi_row():
    """engine.models.common.mm: a 1-row bf16 product equals that row of any multi-row product (the
    GEMV path alone would differ in the last bit for long reductions)."""
    from engine.models.common import mm

    g = torch.Generator().manual_seed(0)
    for K, N in ((1536, 576), (576, 3072), (2048, 512)):
        W = torch.randn(K, N, generator=g).to(torch.bfloat16)
        for _ in range(20):
            x = torch.randn(8, K, generator=g).to(torch.bfloat16)
            one = mm(x[:1], W)
            assert all(torch.equal(one, (x[:M] @ W)[:1]) for M in range(2, 9))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_runs_on_this_cpu_packed_or_not(dtype, monkeypatch):
    """common.Linear packs a weight only where this CPU's oneDNN can (bf16 packing needs AVX-512 or
    AVX-NE-CONVERT and raises on a plain AVX2 CPU): the product works either way, a bf16 row's bits
    do not depend on how many rows run with it, and bf16 2+-row products equal ``x @ W_t``."""
    from engine.models import common

    g = torch.Generator().manual_seed(0)
    W = torch.randn(96, 320, generator=g)  # [out, in], as stored in checkpoints
    x = torch.randn(6, 320, generator=g).to(dtype)
    for pack_ok in (common.packs(dtype), False):
        monkeypatch.setattr(common, "_PACK_OK", {dtype: pack_ok})
        lin = common.Linear(W, dtype, native=False)
        assert lin.packed == pack_ok and lin.shape == (320, 96)
        y = lin(x)
        assert y.dtype == dtype and y.shape == (6, 96)
        assert torch.allclose(y.float(), x.float() @ W.t(), atol=0.5 if dtype == torch.bfloat16 else 1e-4)
        if dtype == torch.bfloat16:
            assert torch.equal(y, x @ W.t().to(dtype))
            assert all(torch.equal(lin(x[:1]), lin(x[:m])[:1]) for m in range(2, 7))
        assert torch.equal(lin.dense(), W.t().to(dtype))
    monkeypatch.setattr(common, "_PACK_OK", {})
    assert common.packs(torch.float16) is False  # never packed: plain layout



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pad", [2, 3, 4, 8])
def test_small_packed_products_padded_to_any_row_count_keep_their_bits(dtype, pad, monkeypatch):
    """common.pad_rows: a packed product of fewer rows than the machine's pad runs as that many
    rows (a 1-row decode step on the AVX-512 EPYC: 22.3 -> 19.7 ms at 4 rows). The rows it returns
    are bit for bit those of the unpadded product, so plain decoding and verify passes still agree."""
    from engine.models import common

    if not common.packs(dtype):
        pytest.skip("oneDNN does not pack this dtype on this CPU")
    g = torch.Generator().manual_seed(1)
    W = torch.randn(1536, 576, generator=g)
    b = torch.randn(1536, generator=g).to(dtype)
    x = torch.randn(8, 576, generator=g).to(dtype)
    lin = common.Linear(W, dtype, native=False)
    monkeypatch.setattr(common, "_PAD_ROWS", {})
    ref = [lin(x[:m]) for m in range(1, 9)]
    refb = [lin(x[:m], b) for m in range(1, 4)]
    monkeypatch.setattr(common, "_PAD_ROWS", {dtype: pad})
    calls = []
    real = torch.ops.mkldnn._linear_pointwise

    class Ops:  # count the rows the packed product is given
        @staticmethod
        def _linear_pointwise(xx, *a):
            calls.append(xx.shape[0])
            return real(xx, *a)

    monkeypatch.setattr(common.torch.ops, "mkldnn", Ops, raising=False)
    for m in range(1, 9):
        y = lin(x[:m])
        assert y.shape == (m, 1536) and torch.equal(y, ref[m - 1])
        assert calls[-1] == (pad if m < pad else m)
    for m in range(1, 4):
        assert torch.equal(lin(x[:m], b), refb[m - 1])


def test_pad_rows_is_decided_once_from_the_probe_or_the_environment(monkeypatch):
    from engine import dtype_probe
    from engine.models import common

    monkeypatch.setattr(common, "_PAD_ROWS", {})
    monkeypatch.delenv("SPECCHAT_PAD_ROWS", raising=False)
    monkeypatch.setattr(common, "packs", lambda dt: dt == torch.bfloat16)
    asked = []
    monkeypatch.setattr(dtype_probe, "packed_rows", lambda dt: asked.append(dt) or 4)
    assert common.pad_rows(torch.bfloat16) == 4 and common.pad_rows(torch.bfloat16) == 4
    assert asked == [torch.bfloat16]  # once per process
    assert common.pad_rows(torch.float32) == 2 and asked == [torch.bfloat16]  # not packed: nothing to measure
    monkeypatch.setattr(common, "_PAD_ROWS", {})
    monkeypatch.setenv("SPECCHAT_PAD_ROWS", "2")
    assert common.pad_rows(torch.bfloat16) == 2 and len(asked) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["packed", "dense", "native"])
def test_drafter_numerics_only_change_single_rows_and_never_under_exact(dtype, layout, monkeypatch):
    """Under ``fast_rows`` (a drafter's calls) one row may take a plain GEMV, kept only where it
    measured faster; its result is the same product up to rounding. Multi-row products, calls
    outside the context and calls under ``exact_rows`` keep the row-consistent bits the target's
    decoding relies on."""
    from engine.models import common

    from engine import native

    if layout == "packed" and not common.packs(dtype):
        pytest.skip(f"this CPU does not pack {dtype}")
    if layout == "native" and (dtype != torch.float32 or native.lib() is None):
        pytest.skip("the C linear is fp32 only (and needs a C compiler)")
    g = torch.Generator().manual_seed(1)
    W = torch.randn(200, 480, generator=g)
    b = torch.randn(200, generator=g).to(dtype)
    x = torch.randn(5, 480, generator=g).to(dtype)
    lin = common.Linear(W, dtype, pack=layout == "packed", native=layout == "native")
    exact1, exact5, exact1b = lin(x[:1]), lin(x), lin(x[:1], b)
    tol = dict(atol=0.3, rtol=0.02) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-5)
    for forced in (None, True):  # as measured on this CPU, then with the GEMV forced on
        if forced:
            lin._gemv = common._layout_t(W.to(dtype), dtype)
        with common.fast_rows():
            y1, y5, y1b = lin(x[:1]), lin(x), lin(x[:1], b)
            with common.exact_rows():
                assert torch.equal(lin(x[:1]), exact1) and torch.equal(lin(x[:1], b), exact1b)
        assert lin._gemv is False or torch.is_tensor(lin._gemv)  # measured on the first fast call
        assert torch.equal(y5, exact5)
        assert torch.allclose(y1.float(), exact1.float(), **tol) and torch.allclose(y1b.float(), exact1b.float(), **tol)
        if lin._gemv is False:
            assert torch.equal(y1, exact1)
        assert torch.equal(lin(x[:1]), exact1)  # outside the context: the exact path again
    with common.exact_rows():
        with common.fast_rows():  # an enclosing exact_rows holds
            assert torch.equal(lin(x[:1]), exact1)

@pytest.fixture(params=["native", "torch"])
def attn_impl(request, monkeypatch):
    """Run a test with the C attention kernel (engine/native) and with the torch blockwise one."""
    from engine import native
    from engine.models import common

    if request.param == "native" and native.lib() is None:
        pytest.skip(f"native kernels {native.status()}")
    monkeypatch.setattr(common, "NATIVE_ATTN", request.param == "native")
    return request.param


@pytest.mark.parametrize("P, G, shape", [(301, 3, (3, 2, 2, 1, 1)), (5, 3, (2, 2, 1)), (64, 1, (3, 3, 2, 1)),
                                          (127, 2, (1, 1, 1, 1)), (190, 3, (4, 1, 1)), (40, 4, (6, 3, 2, 2, 1))])
def test_bf16_tree_attention_rows_equal_plain_decoding_of_their_path(P, G, shape, attn_impl):
    """A tree row sees the prefix and its ancestors with siblings' rows masked in between; in bf16
    it must equal attention over those keys laid out contiguously (what plain decoding of that path
    computes), bit for bit."""
    from engine.models.common import cached_attention

    g = torch.Generator().manual_seed(0)
    K, E = 3, 64
    from engine.policy import plan_from_shape

    parents = list(plan_from_shape(shape))  # packed tree below the root (row 0 = root)
    T = len(parents) + 1
    anc = [[0]]
    for i, p in enumerate(parents):
        anc.append(anc[p + 1] + [i + 1])
    mask = torch.zeros(T, P + T, dtype=torch.bool)
    mask[:, :P] = True
    for r in range(T):
        mask[r, [P + a for a in anc[r]]] = True
    diffs = 0
    for _ in range(6):
        q = (3 * torch.randn(K * G, T, E, generator=g)).to(torch.bfloat16)
        kn, vn = (torch.randn(K, T, E, generator=g).to(torch.bfloat16) for _ in range(2))
        kc, vc = (torch.randn(K, P + T, E, generator=g).to(torch.bfloat16) for _ in range(2))
        out = cached_attention(q, kn, vn, kc.clone(), vc.clone(), P, mask, E ** -0.5)
        for r in range(T):
            keys = list(range(P)) + [P + a for a in anc[r]]
            kc1, vc1 = kc.clone(), vc.clone()
            kc1[:, P:P + T], vc1[:, P:P + T] = kn, vn
            ref = cached_attention(q[:, r:r + 1], kc1[:, keys[-1:]], vc1[:, keys[-1:]], kc1[:, keys].contiguous(),
                                   vc1[:, keys].contiguous(), len(keys) - 1, None, E ** -0.5)
            diffs += not torch.equal(out[r], ref[0])
    assert diffs == 0


def test_dtype_auto_picks_a_dtype_by_measurement():
    from engine.dtype_probe import auto_dtype, cpu_costs
    from engine.loading import parse_dtype

    c = cpu_costs()
    assert c["fp32"] > 0 and c["bf16"] > 0
    assert auto_dtype("cpu") == ("bf16" if c["bf16"] < 0.9 * c["fp32"] else "fp32")
    from engine import native
    from engine.dtype_probe import c_pass_costs
    if native.lib() is not None and native.bf16_records_on():
        cc = c_pass_costs()  # the C pass's own products: what decides for an HF llama checkpoint
        assert cc["fp32"] > 0 and cc["bf16"] > 0
    assert parse_dtype("auto") in (torch.float32, torch.bfloat16)
    assert parse_dtype(None) == torch.float32  # the library default stays fp32
    assert auto_dtype("cuda") == "bf16"


def test_dtype_auto_keeps_fp32_where_the_c_pass_takes_the_model(tmp_path, monkeypatch):
    """A llama-family model runs fp32 in engine/native/llama_rows.c, so "auto" keeps fp32 for it
    even where the product probe favours bf16 (an AVX-512 BF16 CPU) -- unless its weights are
    full-width (an HF checkpoint) and its bf16 passes run in C (the bf16 C pass, bf16_rows.c, or
    the torch pass with the C glue, glue_bf16.c: then bf16 streams half the bytes). Other families
    follow the probe."""
    from engine import dtype_probe, native
    from engine.loading import load, parse_dtype

    monkeypatch.setattr(dtype_probe, "cpu_costs", lambda: {"fp32": 1.0, "bf16": 0.5})
    monkeypatch.setattr(dtype_probe, "c_pass_costs", lambda: {"fp32": 1.0, "bf16": 0.5})
    monkeypatch.setattr(dtype_probe, "native_fp32_pass", lambda: True)
    assert dtype_probe.auto_dtype("cpu", "llama") == "fp32"  # no config: GGUF blocks
    assert dtype_probe.auto_dtype("cpu", "mamba2") == "bf16"
    assert dtype_probe.auto_dtype("cpu") == "bf16"
    assert parse_dtype("auto", "qwen2") == torch.float32

    def compute(kind):
        return load(str(saved(kind, str(tmp_path))), dtype="auto").model.compute_dtype

    glue = native.lib() is not None
    records = native.bf16_records_on()
    assert compute("llama") == (torch.bfloat16 if glue else torch.float32)
    # biases: no glue, but the bf16 C pass takes them
    assert compute("qwen2") == (torch.bfloat16 if records else torch.float32)
    assert compute("mamba2") == torch.bfloat16
    monkeypatch.setenv("SPECCHAT_NATIVE_GLUE", "0")
    monkeypatch.setenv("SPECCHAT_NATIVE_BF16", "0")
    assert compute("llama") == torch.float32
    monkeypatch.delenv("SPECCHAT_NATIVE_GLUE")
    assert compute("llama") == (torch.bfloat16 if glue else torch.float32)  # the glue alone
    monkeypatch.setattr(dtype_probe, "cpu_costs", lambda: {"fp32": 1.0, "bf16": 0.95})  # bf16 not 10% faster
    monkeypatch.setattr(dtype_probe, "c_pass_costs", lambda: {"fp32": 1.0, "bf16": 0.95})
    monkeypatch.delenv("SPECCHAT_NATIVE_BF16")
    assert compute("llama") == torch.float32
    # where the bf16 C pass takes the model, the C pass's own products decide, not torch's (which
    # convert bf16 in software on an AVX2 CPU)
    monkeypatch.setattr(dtype_probe, "cpu_costs", lambda: {"fp32": 1.0, "bf16": 3.0})
    monkeypatch.setattr(dtype_probe, "c_pass_costs", lambda: {"fp32": 1.0, "bf16": 0.5})
    assert compute("qwen2") == (torch.bfloat16 if records else torch.float32)
    assert compute("llama") == (torch.bfloat16 if records else torch.float32)
    monkeypatch.setattr(dtype_probe, "c_pass_costs", lambda: {"fp32": 1.0, "bf16": 1.2})
    monkeypatch.setattr(dtype_probe, "cpu_costs", lambda: {"fp32": 1.0, "bf16": 0.5})
    assert compute("qwen2") == torch.float32  # (without the records: no bf16 pass in C for it at all)
    monkeypatch.setattr(dtype_probe, "cpu_costs", lambda: {"fp32": 1.0, "bf16": 0.5})
    monkeypatch.setattr(dtype_probe, "native_fp32_pass", lambda: False)
    assert dtype_probe.auto_dtype("cpu", "llama") == "bf16"


def test_slow_bf16_note_where_the_probe_finds_bf16_slow(monkeypatch, tmp_path, smollm2_gguf_path, capsys):
    """`distill data/topk --dtype bf16` on a CPU without native bf16 (the probe's bf16 products
    1.5x+ the fp32 ones) prints a one-line note suggesting fp32; never for fp32, CUDA, or a CPU
    where bf16 is fast."""
    from engine import dtype_probe
    from engine.cli import main

    monkeypatch.setattr(dtype_probe, "cpu_costs", lambda: {"fp32": 1.0, "bf16": 8.0})
    monkeypatch.setattr(dtype_probe, "c_pass_costs", lambda: {"fp32": 1.0, "bf16": 8.0})
    note = dtype_probe.slow_bf16_note("bf16")
    assert note and "8.0x slower" in note and "--dtype fp32" in note and "\n" not in note
    assert dtype_probe.slow_bf16_note("fp32") is None and dtype_probe.slow_bf16_note(None) is None
    assert dtype_probe.slow_bf16_note("bf16", "cuda") is None
    assert main(["distill", "data", "--out", str(tmp_path / "d"), "--n", "1", "--max-new-tokens", "2", "--dtype", "bf16"]) == 0
    assert note in capsys.readouterr().err
    monkeypatch.setattr(dtype_probe, "cpu_costs", lambda: {"fp32": 1.0, "bf16": 0.6})
    assert dtype_probe.slow_bf16_note("bf16") is None

    # a model in the bf16 C pass (bf16 records in an fp32 pass: AVX2 and up) is judged by the C
    # pass's own products, a model in torch's bf16 pass by torch's
    class InC:
        compute_dtype, dtype = torch.bfloat16, torch.float32

    class InTorch:
        compute_dtype = dtype = torch.bfloat16

    monkeypatch.setattr(dtype_probe, "cpu_costs", lambda: {"fp32": 1.0, "bf16": 3.0})
    monkeypatch.setattr(dtype_probe, "c_pass_costs", lambda: {"fp32": 1.0, "bf16": 0.5})
    assert dtype_probe.slow_bf16_note("bf16", model=InC()) is None
    assert "3.0x slower" in dtype_probe.slow_bf16_note("bf16", model=InTorch())
