"""The CPU bf16 compute type (engine/native/bf16_rows.c inside llama_rows.c; ``Llama.keep_bf16``):
bf16 weights, each product's activations rounded to bf16, fp32 sums in one fixed chain per output
(AVX-512 BF16's vdpbf16ps: the odd input of a pair, then the even one, each one rounding, denormals
as zero), everything else in fp32.

Checks: the products equal a float64 evaluation of that chain rounded to fp32 at each step, bit for
bit; a row's bits do not depend on the rows, row count or threads run with it, and the vector path
equals the scalar form (SPECCHAT_BF16_PATH=scalar, what CPUs without AVX-512 BF16 would run). On a
CPU with AMX-BF16 the default path is AMX's tile products (SPECCHAT_BF16_PATH=amx), whose sums round
as the hardware does: there the products are held close to the chain, and every row's bits to
themselves whatever rows, row count or threads run with them, which is what lossless needs; the
records hold the bf16 weights exactly; a bf16 llama model takes the C pass, stays close to fp32, and
every greedy strategy equals its own greedy plain decoding; SPECCHAT_NATIVE_BF16=0 keeps torch's
bf16 pass. The scalar chain was matched to vdpbf16ps on a Zen 4 EPYC (3.2M random lanes and the
denormal cases); a CPU whose instruction rounded otherwise would fail the first test here, not the
engine's losslessness (one path runs per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from engine import native
from engine.models import common, quant

from .test_quant import assert_rows_consistent
from .tiny import saved

@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny"))


needs_native = pytest.mark.skipif(native.lib() is None, reason=f"native kernels {native.status()}")
TINY = 1.1754943508222875e-38  # the smallest normal fp32


def _flush(t: torch.Tensor) -> torch.Tensor:
    """Denormals as (signed) zero."""
    return torch.where(t.abs() < TINY, t * 0.0, t)


def _abs_scale(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """|x| @ |W|^T over the bf16-rounded operands: the size of the terms each output sums."""
    return _flush(x).to(torch.bfloat16).float().abs().double() @ W.to(torch.bfloat16).float().abs().double().t()


def assert_close_to_chain(y: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, W: torch.Tensor, bias=None) -> None:
    """AMX's sums (rounded as the hardware rounds them) close to the chain's: |y - ref| <= 2^-19 of
    the terms' absolute sum (measured on a Xeon with AMX: at most ~2^-23 over these tests' shapes)."""
    tol = _abs_scale(x, W) * 2.0**-19 + 1e-30
    if bias is not None:
        tol = tol + bias.abs().double() * 2.0**-23
    err = (y.double() - ref.double()).abs()
    assert bool((err <= tol).all()), float((err / tol).max())


def _reference(x: torch.Tensor, W: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The chain of bf16_rows.c's header evaluated in float64 and rounded to fp32 after every step
    (a bf16 x bf16 product is exact; an fp32 + such a product is exact in float64 up to the far
    tails, so one rounding to fp32 is the fused step's)."""
    xb = _flush(_flush(x).to(torch.bfloat16).float()).double()
    wb = _flush(W.to(torch.bfloat16).float()).double()  # (N, K)
    R, K = x.shape
    acc = torch.zeros(R, W.shape[0], dtype=torch.float32)
    for p in range(K // 2):
        for i in (2 * p + 1, 2 * p):
            acc = _flush((acc.double() + xb[:, i:i + 1] * wb[:, i][None]).float())
    return acc if bias is None else acc + bias


@needs_native
@pytest.mark.parametrize("K, N", [(576, 40), (2, 5), (34, 17), (96, 100), (1536, 16), (576, 1536), (64, 300)])
def test_bf16_products_are_the_chain_and_row_consistent(K, N):
    g = torch.Generator().manual_seed(K + N)
    W = torch.randn(N, K, generator=g) * 0.2
    lin = common.Linear.bf16(W)
    assert "native BF16" in repr(lin) and lin.shape == (K, N)
    b = torch.randn(N, generator=g)
    x = torch.randn(40, K, generator=g) * torch.rand(40, 1, generator=g) * 4
    x[3] = 0.0
    x[4, : K // 2] = 1e-39  # denormal activations: zero, as vdpbf16ps takes them
    x[5] = 3e-38 * (1 + torch.rand(K, generator=g))  # normal, but their products and sums underflow: flushed
    y = lin(x, b)
    if native.bf16_path() == "amx" and K % 32 == 0:  # the tile products (K % 32 != 0: the vector path)
        assert_close_to_chain(y, _reference(x, W, b), x, W, b)
        assert_close_to_chain(lin(x), _reference(x, W, None), x, W)
    else:
        assert torch.equal(y, _reference(x, W, b))
        assert torch.equal(lin(x), _reference(x, W, None))
    # every row's bits alone, whichever rows run with it, on 1 or 2 threads (N = 1536: the column
    # blocks split between the threads, 8 at a time for 1-2 rows; AMX: tiles of <= 16 rows, rows
    # 17-40 in even groups run two at a time, an odd last one padded)
    assert_rows_consistent(lin, x, b, y)
    # without a bias, a pass of <= 16 rows stores AMX's tiles straight into its output where its
    # blocks are whole (session 48), and a larger one goes through the copy: the same bits a row
    assert_rows_consistent(lambda xr, _b: lin(xr), x, None, lin(x))


@needs_native
def test_bf16_records_hold_the_bf16_weights():
    g = torch.Generator().manual_seed(1)
    W = torch.randn(37, 64, generator=g)
    lin = common.Linear.bf16(W)
    exact = W.to(torch.bfloat16).float()
    assert torch.equal(lin.dense(), exact.t())
    ids = torch.tensor([0, 36, 17, 16, 15])
    assert torch.equal(quant.dequantize_rows(lin._qrec, "BF16", 37, 64, ids), exact[ids])
    sub = lin.take_cols(torch.tensor([3, 20, 36]))  # a drafter's draft vocabulary: still bf16 records
    assert "native BF16" in repr(sub) and torch.equal(sub.dense(), exact[[3, 20, 36]].t())
    with pytest.raises(ValueError):
        quant.pack_bf16(torch.randn(4, 7))


_PATH_CHILD = r"""
import json, torch
from engine import native
from engine.models import common
g = torch.Generator().manual_seed(7)
out = []
for K, N, R in ((576, 1536, 1), (576, 96, 3), (1536, 40, 8), (64, 33, 11), (34, 5, 2), (576, 256, 2), (96, 200, 4),
                (64, 130, 7), (32, 64, 5), (576, 70, 16), (128, 48, 23), (96, 64, 40), (576, 100, 6), (64, 48, 12),
                (576, 70, 97), (1536, 48, 31)):  # the AVX2 path's row chunks: 40 + 40 + 17, 15 + 15 + 1
    W = torch.randn(N, K, generator=g) * 0.3
    x = torch.randn(R, K, generator=g) * 3
    x[0, :4] = 1e-39
    W[:2, :6] = 1e-40
    x[-1, : K // 2] = 3e-38  # products and partial sums below the normal range: flushed
    lin = common.Linear.bf16(W)
    y = lin(x)
    # a row alone, and the rows in two parts, give the same bits (every path)
    rows_ok = all(torch.equal(lin(x[r:r + 1]), y[r:r + 1]) for r in range(R)) and torch.equal(
        torch.cat([lin(x[: R // 2]), lin(x[R // 2:])]), y)
    out.append({"bits": y.view(torch.int32).flatten().tolist()[:4000], "rows_ok": rows_ok})
print(json.dumps({"path": native.bf16_path(), "out": out}))
"""


@needs_native
def test_bf16_kernel_paths_agree_bit_for_bit():
    """The AVX-512 BF16 kernel (SPECCHAT_BF16_PATH=avx512), the AVX2 one (=avx2) and the scalar
    form (=scalar) give the same bits, denormal weights and activations included; AMX's tile
    products (=amx, the default where the CPU has them) stay close to them. Every path keeps a row's
    bits whatever rows run with it. A path this CPU lacks falls back to the next slower one (amx ->
    avx512 -> avx2 -> scalar), which the test above holds to the chain."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outs = {}
    for path in ("", "avx512", "amx", "avx2", "scalar"):
        env = dict(os.environ, SPECCHAT_BF16_PATH=path, PYTHONPATH=root)
        r = subprocess.run([sys.executable, "-c", _PATH_CHILD], capture_output=True, text=True, env=env, cwd=root, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        outs[path] = json.loads(r.stdout.strip().splitlines()[-1])
        assert all(o["rows_ok"] for o in outs[path]["out"]), path
    flags = _cpu_flags()
    assert outs["scalar"]["path"] == "scalar"
    if {"avx2", "fma"} <= flags:
        assert outs["avx2"]["path"] == "avx2"  # a CPU with the instructions runs them
    if "avx512_bf16" in flags:
        assert outs["avx512"]["path"] == "avx512"
    else:
        assert outs["avx512"]["path"] == outs["avx2"]["path"]
    if "amx_bf16" not in flags:
        assert outs["amx"]["path"] == outs["avx512"]["path"]
    assert outs[""]["path"] == outs["amx"]["path"]  # the default: the best path here
    bits = {p: [o["bits"] for o in outs[p]["out"]] for p in outs}
    assert bits["avx512"] == bits["scalar"], outs["avx512"]["path"]
    assert bits["avx2"] == bits["scalar"], outs["avx2"]["path"]
    if outs["amx"]["path"] == "amx":
        for a, s in zip(bits["amx"], bits["scalar"]):
            fa = torch.tensor(a, dtype=torch.int32).view(torch.float32).double()
            fs = torch.tensor(s, dtype=torch.int32).view(torch.float32).double()
            assert bool(((fa - fs).abs() <= 2.0**-14 * fs.abs().max() + 1e-30).all())
    else:
        assert bits["amx"] == bits["scalar"]


@needs_native
def test_bf16_products_between_torch_bf16_products():
    """torch's bf16 products (oneDNN, which on a CPU with AMX loads its own tile configuration and
    releases it) running on the same thread between ours, as a torch bf16 drafter's pass does
    between a C-pass target's: ours give the same bits as alone (on AMX, a configuration cached
    across calls faulted with an illegal instruction there)."""
    g = torch.Generator().manual_seed(3)
    W = torch.randn(96, 64, generator=g)
    lin = common.Linear.bf16(W)
    x = torch.randn(5, 64, generator=g)
    alone = [lin(x[:r]) for r in (1, 5, 2)]
    a = torch.randn(64, 256, generator=g).to(torch.bfloat16)
    b = torch.randn(256, 128, generator=g).to(torch.bfloat16)
    for _ in range(3):
        for r, want in zip((1, 5, 2), alone):
            (a @ b).sum()
            torch.nn.functional.linear(a, b.t().contiguous())
            assert torch.equal(lin(x[:r]), want)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((ln for ln in f if ln.startswith("flags")), "").split())
    except OSError:
        return set()


def _bf16_env(monkeypatch):
    """Where this CPU has no AVX-512 BF16, the scalar form stands in (the C pass takes bf16 models
    only where asked for it then)."""
    if native.bf16_path() == "scalar":
        monkeypatch.setenv("SPECCHAT_BF16_PATH", "scalar")


@needs_native
def test_bf16_llama_takes_the_c_pass_and_is_close(root, monkeypatch):
    from engine.loading import load

    _bf16_env(monkeypatch)
    ref = load(str(saved("llama", root)))
    lb = load(str(saved("llama", root)), dtype="bf16")
    m = lb.model
    assert lb.compute == "bfloat16" and m.compute_dtype == torch.bfloat16 and m.dtype == torch.float32
    assert m.kv_bf16 and m.embed.dtype == torch.bfloat16 and m._native_table() is not None
    kinds = {repr(lin) for lin in [m.lm_head_t] + [lyr[k] for lyr in m.layers for k in ("wqkv", "wo", "wgu", "wd")]}
    assert all("native BF16" in k for k in kinds)
    ids = list(range(1, 40))
    a, b = ref.model.full_logits(ids), m.full_logits(ids)
    assert b.dtype == torch.float32 and (a - b).abs().max().item() < 0.05 * a.abs().max().item()
    assert not torch.equal(a, b)
    # verify rows of a chain are the one-token steps' rows, bit for bit
    m.allocate(128)
    m.prefill(ids[:20])
    chain = m.verify(ids[20:28], list(range(-1, 7)))
    steps = []
    m2 = load(str(saved("llama", root)), dtype="bf16").model
    m2.allocate(128)
    m2.prefill(ids[:20])
    for t in ids[20:28]:
        steps.append(m2.verify([t], [-1])[0])
        m2.commit([0])
    assert torch.equal(chain, torch.stack(steps))


@needs_native
def test_bf16_c_pass_is_lossless(root, monkeypatch):
    """Every greedy strategy equals greedy plain decoding in this compute type, with a separate
    drafter (fp32 llama) and without (the target drafting for itself)."""
    from engine.loading import load
    from engine.strategy import preset

    from .test_native import _greedy_strategies_equal_ar

    _bf16_env(monkeypatch)
    m = load(str(saved("llama", root)), dtype="bf16").model
    assert m.compute_dtype == torch.bfloat16 and m._native_table() is not None
    strategies = [preset("sd", draft_len=4), preset("tree", tree=(3, 2, 2, 1, 1)), preset("pld"), preset("hybrid"), preset("mab")]
    _greedy_strategies_equal_ar(m, load(str(saved("draft", root))).model, strategies)
    _greedy_strategies_equal_ar(m, m, strategies[:2])


@needs_native
def test_native_bf16_switch_keeps_the_torch_pass(root, monkeypatch):
    from engine.loading import load

    _bf16_env(monkeypatch)
    assert "native BF16" in repr(load(str(saved("llama", root)), dtype="bf16").model.layers[0]["wqkv"])
    monkeypatch.setenv("SPECCHAT_NATIVE_BF16", "0")
    lb = load(str(saved("llama", root)), dtype="bf16")
    assert lb.compute == "bfloat16" and lb.model.dtype == torch.bfloat16
    assert "BF16" not in repr(lb.model.layers[0]["wqkv"])


@needs_native
def test_bf16_c_pass_only_where_its_shapes_fit(monkeypatch):
    """One test (``llama.bf16_fits``) decides for the loader, ``--dtype auto`` and ``keep_bf16``: a
    head size the C pass's bf16 KV cache does not take (> 128) stays in torch's bf16 pass, and
    auto does not pick bf16 for it on that account."""
    from engine import dtype_probe
    from engine.models import llama

    _bf16_env(monkeypatch)
    base = dict(model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1)
    assert llama.bf16_fits(llama.LlamaConfig.from_hf(base)) and dtype_probe.bf16_c_pass(base)
    wide = dict(base, hidden_size=512, num_attention_heads=2, head_dim=256)
    assert not llama.bf16_fits(llama.LlamaConfig.from_hf(wide))
    monkeypatch.setenv("SPECCHAT_NATIVE_GLUE", "0")
    assert not dtype_probe.bf16_c_pass(wide)
    monkeypatch.setenv("SPECCHAT_NATIVE_BF16", "0")
    assert not llama.bf16_fits(llama.LlamaConfig.from_hf(base))
