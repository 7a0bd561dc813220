"""GGUF Q4_1 / Q8_0 matrices kept quantised (engine/models/quant.py, linear.c ``linear_rows_q``).

The kernel must give the same bits as the fp32 kernel over the dequantised matrix (GGUF's own
dequantisation, gguf.quants), for any number of rows, any row offset, 1 or 2 threads, with a
bias; and a quantised GGUF model must give the dequantised model's logits bit for bit, so every
greedy strategy still equals plain greedy decoding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import native
from engine.models import common, quant

needs_native = pytest.mark.skipif(native.lib() is None, reason=f"native kernels {native.status()}")


def _quantised(N: int, K: int, qtype: str, seed: int) -> tuple[np.ndarray, torch.Tensor]:
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    W = rng.standard_normal((N, K)).astype(np.float32) * rng.uniform(0.01, 3, size=(N, 1)).astype(np.float32)
    raw = quantize(W, gguf.GGMLQuantizationType[qtype])
    return raw, torch.from_numpy(quant.gguf_blocks(raw, qtype).reshape(N, K))


def assert_rows_consistent(lq, x: torch.Tensor, b: torch.Tensor, full: torch.Tensor) -> None:
    """Each row of ``lq(x, b)`` (= ``full``) has the same bits whichever rows run with it (offsets,
    every row count 1..20: every split into row groups), on 1 or 2 threads, also strided."""
    threads = torch.get_num_threads()
    try:
        for nt in (1, 2):
            torch.set_num_threads(nt)
            for a, e in [(0, 1), (7, 8), (0, 2), (3, 6), (0, 4), (1, 5), (0, 5), (3, 9), (10, 26), (1, 40)]:
                assert torch.equal(lq(x[a:e], b), full[a:e]), (nt, a, e)
            for r in range(1, 21):
                assert torch.equal(lq(x[:r], b), full[:r]), (nt, r)
            assert torch.equal(lq(x[None, 3:9], b)[0], full[3:9])
            xs = torch.cat([x[:6], x[:6]], 1)[:, : x.shape[1]]  # rows with a stride of 2K
            assert torch.equal(lq(xs, b), full[:6])
    finally:
        torch.set_num_threads(threads)


@needs_native
@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("K, N", [(576, 1536), (32, 5), (96, 17), (160, 64), (1536, 100)])
def test_quantised_rows_equal_the_fp32_kernel_over_gguf_dequantisation(qtype, K, N):
    raw, Wd = _quantised(N, K, qtype, K + N)
    lq = common.Linear.quantized(quant.pack(raw, qtype, K), qtype, K, N)
    lf = common.Linear(Wd, torch.float32, native=True)
    assert f"native {qtype}" in repr(lq)
    assert torch.equal(lq.dense(), Wd.t())  # the records hold exactly GGUF's dequantised weights
    g = torch.Generator().manual_seed(N)
    b = torch.randn(N, generator=g)
    x = torch.randn(40, K, generator=g)
    full = lq(x, b)
    assert torch.equal(full, lf(x, b))
    assert torch.equal(lq(x), lf(x))
    xs = torch.randn(6, 2 * K, generator=g)[:, ::2]  # strided input rows
    assert_rows_consistent(lq, x, b, full)
    assert torch.equal(lq(xs), lf(xs.contiguous()))
    ids = torch.tensor([0, N - 1, N // 2, 0])
    assert torch.equal(quant.dequantize_rows(lq._qrec, qtype, N, K, ids), Wd[ids])
    assert torch.equal(lq.take_cols(torch.tensor([0, N - 1]))(x[:3]), lq(x[:3])[:, [0, N - 1]])


def test_pack_rejects_what_it_cannot_hold():
    raw, _ = _quantised(4, 64, "Q4_1", 0)
    with pytest.raises(ValueError):
        quant.pack(raw, "Q5_0", 64)
    with pytest.raises(ValueError):
        quant.pack(raw, "Q4_1", 96)  # row length disagrees with K


def _write_quantised_llama(path, *, mixed: bool, head: str | None = None) -> None:
    """A 2-layer llama GGUF (tied Q8_0 embedding, Q4_1 projections; ``mixed``: k in Q8_0 and the
    MLP down projection in F16, which must stay fp32; ``head``: an untied output layer of that
    type, "F16" or "Q8_0")."""
    import gguf
    from gguf.quants import quantize

    from tests.conftest import tiny_vocab

    rng = np.random.default_rng(5)
    tokens, types, merges = tiny_vocab()
    V, D, F, H, KV = len(tokens), 64, 96, 4, 2
    E = D // H
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in (("block_count", 2), ("embedding_length", D), ("feed_forward_length", F),
                 ("attention.head_count", H), ("attention.head_count_kv", KV), ("context_length", 256)):
        w.add_uint32(f"llama.{k}", v)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    shapes = {"token_embd.weight": (V, D), "output_norm.weight": (D,)}
    if head is not None:
        shapes["output.weight"] = (V, D)
    for i in range(2):
        shapes.update({f"blk.{i}.attn_norm.weight": (D,), f"blk.{i}.ffn_norm.weight": (D,), f"blk.{i}.attn_q.weight": (H * E, D),
                       f"blk.{i}.attn_k.weight": (KV * E, D), f"blk.{i}.attn_v.weight": (KV * E, D),
                       f"blk.{i}.attn_output.weight": (D, H * E), f"blk.{i}.ffn_gate.weight": (F, D),
                       f"blk.{i}.ffn_up.weight": (F, D), f"blk.{i}.ffn_down.weight": (D, F)})
    for name, shape in shapes.items():
        t = (rng.standard_normal(shape) * (0.3 if len(shape) == 2 else 1)).astype(np.float32)
        if len(shape) == 1:
            w.add_tensor(name, np.abs(t) + 0.5)
            continue
        qt = "Q8_0" if name == "token_embd.weight" or (mixed and "attn_k" in name) else "Q4_1"
        if name == "output.weight":
            qt = head
        if mixed and "ffn_down" in name or qt == "F16":
            w.add_tensor(name, t.astype(np.float16))
            continue
        q = quantize(t, gguf.GGMLQuantizationType[qt])
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType[qt])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@needs_native
@pytest.mark.parametrize("mixed", [False, True])
def test_quantised_gguf_model_is_the_dequantised_model_bit_for_bit(mixed, tmp_path, monkeypatch):
    from engine.generate import Decoder, run_generation
    from engine.loading import load
    from engine.strategy import preset

    path = tmp_path / "q.gguf"
    _write_quantised_llama(path, mixed=mixed)
    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})
    monkeypatch.setenv("SPECCHAT_QUANT", "0")
    ref = load(str(path), dtype="fp32").model
    monkeypatch.setenv("SPECCHAT_QUANT", "1")
    q = load(str(path), dtype="fp32").model
    kinds = {repr(lin).split(", ")[-1].rstrip(")") for lin in [q.lm_head_t] + [lyr[k] for lyr in q.layers for k in ("wqkv", "wo", "wgu", "wd")]}
    assert kinds == ({"native Q8_0", "native Q4_1", "native"} if mixed else {"native Q8_0", "native Q4_1"})
    assert "Q4_1" not in repr(ref.layers[0]["wgu"])
    ids = list(range(3, 60))
    assert torch.equal(q.full_logits(ids), ref.full_logits(ids))
    prompt = [5, 9, 3, 5, 9, 3, 7, 2, 5, 9, 11, 4]
    dq, dref = Decoder(q, q), Decoder(ref, ref)
    want, _ = run_generation(dref, prompt, preset("ar"), 40)
    want = [t for e in want for t in e.emitted]
    for s in (preset("ar"), preset("sd", draft_len=4), preset("tree", tree=(3, 2, 1)), preset("pld"), preset("hybrid")):
        evs, _ = run_generation(dq, prompt, s, 40)
        assert [t for e in evs for t in e.emitted] == want, s.label()


@needs_native
@pytest.mark.parametrize("head", ["F16", "Q8_0"])
@pytest.mark.parametrize("dtype", ["fp32", "q8"])
def test_an_untied_head_is_its_own_matrix(head, dtype, tmp_path, monkeypatch):
    """An untied output layer (F16: no blocks kept; Q8_0: its own blocks) is never replaced by the
    embedding's blocks: the logits are the dequantised model's (fp32), and close to them in q8."""
    from engine.loading import load

    path = tmp_path / "q.gguf"
    _write_quantised_llama(path, mixed=False, head=head)
    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})
    q = load(str(path), dtype=dtype)
    assert not q.model.cfg.tie_word_embeddings
    assert (head in repr(q.model.lm_head_t)) == (head == "Q8_0")
    monkeypatch.setenv("SPECCHAT_QUANT", "0")
    ref = load(str(path), dtype="fp32").model
    ids = list(range(3, 40))
    got, want = q.model.full_logits(ids), ref.full_logits(ids)
    if dtype == "fp32":
        assert torch.equal(got, want)
    else:  # 8-bit activations: close to the output layer's logits (the embedding's are far off)
        cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
        assert cos > 0.98, float(cos)


@needs_native
def test_smollm2_projections_keep_the_gguf_blocks(smollm2_gguf_path, monkeypatch):
    """The shipped default (SmolLM2-135M Q4_1, Q8_0 tied embedding): every projection and the head
    are kept quantised, and the logits equal the dequantised fp32 model's."""
    from engine.loading import load

    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})
    q = load(str(smollm2_gguf_path), dtype="fp32").model
    assert "Q8_0" in repr(q.lm_head_t)
    assert all("Q4_1" in repr(lyr[k]) for lyr in q.layers for k in ("wqkv", "wo", "wgu", "wd"))
    monkeypatch.setenv("SPECCHAT_QUANT", "0")
    ref = load(str(smollm2_gguf_path), dtype="fp32").model
    assert torch.equal(q.layers[3]["wqkv"].dense(), ref.layers[3]["wqkv"].dense())  # q/k rows unpermuted alike
    ids = list(range(100, 140))
    assert torch.equal(q.full_logits(ids), ref.full_logits(ids))


@needs_native
@pytest.mark.parametrize("act8", [False, True])
def test_a_drafter_in_q8_0_drafts_close_and_stays_lossless(act8, tmp_path, monkeypatch):
    """Mamba-2 drafter weights quantised to Q8_0 (engine/session.py loads drafters so; ``act8``:
    with 8-bit activations too, the default where quant_a8.c is vectorised): the C draft step runs
    on the records, its logits stay close to the fp32 drafter's, and greedy speculative decoding
    with it still equals plain greedy decoding."""
    from engine.generate import Decoder, run_generation
    from engine.loading import load
    from engine.strategy import preset

    from .tiny import saved

    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})
    ref = load(str(saved("mamba2", str(tmp_path)))).model
    d = load(str(saved("mamba2", str(tmp_path)))).model
    assert d.quantize_for_drafting(act8) == 2 * len(d.layers) + 1
    kind = "Q8_0a8" if act8 else "Q8_0"
    assert f"native {kind})" in repr(d.layers[0][1].w_in) and f"native {kind})" in repr(d.lm_head_t)
    logits = []
    for m in (ref, d):
        m.allocate()
        m.prefill(list(range(3, 30)))
        with common.fast_rows(), torch.inference_mode():
            b = m.fork(2)
            logits.append(b.step(torch.tensor([5, 9])))
    assert torch.allclose(logits[0], logits[1], atol=0.05 * logits[0].abs().max().item())
    target = load(str(saved("llama", str(tmp_path)))).model
    d.allocate()
    dec = Decoder(target, d)
    prompt = [1, 5, 9, 3, 5, 9, 3, 7, 2]
    want, _ = run_generation(dec, prompt, preset("ar"), 30)
    want = [t for e in want for t in e.emitted]
    for s in (preset("sd", draft_len=4), preset("tree", tree=(2, 2, 1)), preset("sd", adaptive=True)):
        evs, _ = run_generation(dec, prompt, s, 30)
        assert [t for e in evs for t in e.emitted] == want, s.label()


@needs_native
@pytest.mark.parametrize("qtype", ["Q4_1a8", "Q8_0a8"])
def test_a8_records_packed_in_c_are_numpys_bytes(qtype):
    """quant_a8.c's ``a8_pack`` (the load-time path) writes exactly ``_pack_a8``'s records, padding
    included (N not a multiple of 16), for random block bytes."""
    bs = quant._GGUF_BLOCK[qtype[:4]]
    rng = np.random.default_rng(11)
    for N, K in [(1, 32), (15, 64), (16, 96), (17, 32), (100, 576), (576, 1536)]:
        raw = rng.integers(0, 256, (N, K // 32 * bs), dtype=np.uint8)
        assert torch.equal(quant.pack(raw, qtype, K), quant.pack(raw, qtype, K, native=False)), (N, K)


@pytest.mark.parametrize("in_c", [True, False])
def test_q8_0_quantisation_is_gguf_bytes(in_c, monkeypatch):
    """A drafter's weights go to Q8_0 at load through quant_a8.c's q8_0_quantize (or torch without
    the C kernels): the same bytes as gguf.quants, ties (x / d at k + 0.5) and all-zero, tiny
    (d subnormal in fp16) and huge (d past fp16's range) blocks included."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quantize

    if in_c and native.lib() is None:
        pytest.skip(f"native kernels {native.status()}")
    if not in_c:
        monkeypatch.setattr(native, "lib", lambda: None)
    g = torch.Generator().manual_seed(3)
    ties = torch.randint(-254, 255, (64, 96), generator=g).float() / 2 * (2.5 / 127)
    ties[:, ::32] = 2.5  # each block's max is 2.5: x / d near k / 2, about half of them ties
    cases = [torch.randn(300, 480, generator=g) * 0.05, ties, torch.zeros(5, 64),
             torch.cat([torch.zeros(3, 32), torch.randn(3, 32, generator=g) * 1e-6]), torch.randn(4, 64, generator=g) * 1e7,
             torch.randn(5000, 32, generator=g)]  # more rows than the torch path's chunk
    for w in cases:
        assert np.array_equal(quant.quantize_rows(w, "Q8_0"), quantize(w.numpy(), GGMLQuantizationType.Q8_0)), w.shape


@needs_native
@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("dtype", ["fp32", "q8"])
def test_a_deferred_gguf_load_builds_the_same_model(mixed, dtype, tmp_path, monkeypatch):
    """The CPU load defers the fp32 copies of the matrices kept in their blocks (engine/gguf.py
    ``defer``): none of them is dequantised, and the model is the fully loaded one's bit for bit.
    ``mixed`` (k in Q8_0 beside Q4_1 q/v: the fused qkv cannot take the blocks) falls back to the
    full load, which must give the same model too."""
    import engine.gguf as gg
    from engine.loading import load

    path = tmp_path / "q.gguf"
    _write_quantised_llama(path, mixed=mixed)
    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})
    read, materialized = [], []
    real_read, real_mat = gg._read_weight, gg.GGUFCheckpoint.materialize
    monkeypatch.setattr(gg, "_read_weight", lambda f, g, *a: read.append(g) or real_read(f, g, *a))
    monkeypatch.setattr(gg.GGUFCheckpoint, "materialize", lambda ck: materialized.append(bool(ck.deferred)) or real_mat(ck))
    fast = load(str(path), dtype=dtype)
    if mixed:
        assert materialized == [True]  # the fallback: every deferred matrix read after all
    else:
        assert materialized == [] and all(".attn_" not in g and ".ffn_" not in g or "norm" in g for g in read), read
        assert "token_embd.weight" in read  # looked up in fp32
    real_load = gg.load_gguf
    monkeypatch.setattr(gg, "load_gguf", lambda p, defer=False: real_load(p, defer=False))
    full = load(str(path), dtype=dtype)
    assert (fast.kept_quantized, fast.act8) == (full.kept_quantized, full.act8) and fast.kept_quantized > 0
    fm, rm = fast.model, full.model
    assert [repr(x) for x in [fm.lm_head_t, *[lyr[k] for lyr in fm.layers for k in ("wqkv", "wo", "wgu", "wd")]]] == \
           [repr(x) for x in [rm.lm_head_t, *[lyr[k] for lyr in rm.layers for k in ("wqkv", "wo", "wgu", "wd")]]]
    ids = list(range(3, 50))
    assert torch.equal(fm.full_logits(ids), rm.full_logits(ids))
