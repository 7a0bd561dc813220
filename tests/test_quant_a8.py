"""The q8 compute type (engine/native/quant_a8.c, ``--dtype q8``): a GGUF's Q4_1 / Q8_0 products
with activations quantised per 32 inputs to int8 and exact integer dot products (llama.cpp's CPU
scheme).

Not bit-identical to fp32 (the activations are rounded), so the checks are: the records hold GGUF's
weights exactly; the products equal a float64 evaluation of the same formula to fp32 rounding; every
row's bits are independent of how many rows, which rows and how many threads run with it, and the
AVX-512 VNNI path equals the scalar one bit for bit (what lossless needs within the dtype); a q8
model stays close to the fp32 one and every greedy strategy equals its own greedy plain decoding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from engine import native
from engine.models import common, quant

from .test_quant import _quantised, _write_quantised_llama, assert_rows_consistent

needs_native = pytest.mark.skipif(native.lib() is None, reason=f"native kernels {native.status()}")


def _reference(x: torch.Tensor, W: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x quantised as the kernel does (dx = max|x| / 127 per 32 inputs, round half to even), then the
    product in float64 with GGUF's dequantised weights."""
    R, K = x.shape
    xb = x.reshape(R, K // 32, 32)
    dx = xb.abs().amax(-1, keepdim=True) / 127.0  # fp32, as the kernel
    inv = torch.where(dx != 0, 1.0 / dx, torch.zeros_like(dx))
    qx = torch.round(xb * inv).clamp(-127, 127)  # torch.round: half to even, like nearbyintf
    y = (qx.double() * dx.double()).reshape(R, K) @ W.double().t()
    return y if bias is None else y + bias.double()


@needs_native
@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("K, N", [(576, 1536), (32, 5), (96, 17), (160, 64), (1536, 100)])
def test_a8_products_are_the_quantised_formula_and_row_consistent(qtype, K, N):
    raw, Wd = _quantised(N, K, qtype, K + N)
    qt = qtype + "a8"
    lq = common.Linear.quantized(quant.pack(raw, qt, K), qt, K, N)
    assert f"native {qt}" in repr(lq)
    assert torch.equal(lq.dense(), Wd.t())  # the records hold exactly GGUF's dequantised weights
    ids = torch.tensor([0, N - 1, N // 2, 0])
    assert torch.equal(quant.dequantize_rows(lq._qrec, qt, N, K, ids), Wd[ids])
    g = torch.Generator().manual_seed(N)
    b = torch.randn(N, generator=g)
    x = torch.randn(40, K, generator=g) * torch.rand(40, 1, generator=g) * 4
    x[5, :32] = 0.0  # an all-zero block: scale 0, no division by zero
    full = lq(x, b)
    ref = _reference(x, Wd, b)
    scale = (x.abs() @ Wd.abs().t()).double() + b.abs().double()  # bound on the fp32 rounding's reach
    assert ((full.double() - ref).abs() <= 1e-5 * scale + 1e-6).all()
    fp32 = x @ Wd.t() + b
    assert (full - fp32).abs().max() < 0.05 * fp32.abs().max()  # close to the unrounded product
    assert_rows_consistent(lq, x, b, full)
    cols = lq.take_cols(torch.tensor([0, N - 1]))  # a drafter's draft vocabulary: the columns stay in q8 records
    assert f"native {qt})" in repr(cols)
    want = lq(x[:3])[:, [0, N - 1]]
    if qtype == "Q8_0":  # GGUF's Q8_0 blocks reach +-127: quantising their weights again is exact
        assert torch.equal(cols(x[:3]), want)
    else:
        assert (cols(x[:3]) - want).abs().max() < 0.05 * want.abs().max()


_PATH_CHILD = r"""
import json, sys, torch
from engine import native
from engine.models import common, quant
from tests.test_quant import _quantised
out = {}
for qtype in ("Q4_1", "Q8_0"):
    raw, _ = _quantised(37, 160, qtype, 3)
    lq = common.Linear.quantized(quant.pack(raw, qtype + "a8", 160), qtype + "a8", 160, 37)
    x = torch.randn(11, 160, generator=torch.Generator().manual_seed(1)) * 3
    x[0, :32] = 0.0  # an all-zero block: dx = 0
    x[1, :32] = torch.arange(32) - 15.5  # dx = 15.5 / 127: x / dx lands near ties ...
    x[2, :32] = torch.tensor([127.0] + [k + 0.5 for k in range(-15, 16)])  # ... and on them (dx = 1): half to even
    x[3, 32:64] = -1e-30  # tiny values: a subnormal-range scale
    out[qtype] = lq(x).view(torch.int32).flatten().tolist()
print(json.dumps({"path": native.a8_path(), "out": out}))
"""


@needs_native
def test_a8_kernel_paths_agree_bit_for_bit():
    """The AMX-INT8 tiles, the AVX-512 VNNI kernel, the AVX2 one and the scalar loop
    (SPECCHAT_A8_PATH; what CPUs without AMX, VNNI or AVX2 run) give the same bits: integer sums
    are exact and the fp32 steps run in the same order. Paths this machine lacks fall back to the
    best it has."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outs = {}
    for path in ("amx", "vnni", "avx2", "scalar"):
        env = dict(os.environ, SPECCHAT_A8_PATH=path, PYTHONPATH=root)
        r = subprocess.run([sys.executable, "-c", _PATH_CHILD], capture_output=True, text=True, env=env, cwd=root, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        outs[path] = json.loads(r.stdout.strip().splitlines()[-1])
    assert outs["scalar"]["path"] == "scalar"
    assert outs["amx"]["out"] == outs["vnni"]["out"] == outs["avx2"]["out"] == outs["scalar"]["out"], \
        {k: v["path"] for k, v in outs.items()}


def test_pack_a8_rejects_what_it_cannot_hold():
    raw, _ = _quantised(4, 64, "Q4_1", 0)
    with pytest.raises(ValueError):
        quant.pack(raw, "Q5_0a8", 64)
    with pytest.raises(ValueError):
        quant.pack(raw, "Q4_1a8", 96)


@needs_native
def test_q8_gguf_model_is_close_to_fp32_and_lossless(tmp_path, monkeypatch):
    from engine.generate import Decoder, run_generation
    from engine.loading import load
    from engine.strategy import preset

    path = tmp_path / "q.gguf"
    _write_quantised_llama(path, mixed=True)
    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})
    ref = load(str(path), dtype="fp32")
    q8 = load(str(path), dtype="q8")
    assert q8.act8 and q8.compute == "q8" and "q8" in q8.description and not ref.act8
    assert q8.model.kv_bf16 and not ref.model.kv_bf16  # the q8 type keeps its KV cache in bf16
    kinds = {repr(lin).split(", ")[-1].rstrip(")") for lin in [q8.model.lm_head_t] + [lyr[k] for lyr in q8.model.layers for k in ("wqkv", "wo", "wgu", "wd")]}
    assert kinds == {"native Q8_0a8", "native Q4_1a8", "native"}  # the F16 down projection stays fp32
    ids = list(range(3, 60))
    a, b = q8.model.full_logits(ids), ref.model.full_logits(ids)
    assert (a - b).abs().max() < 0.05 * b.abs().max()
    assert not torch.equal(a, b)
    m = q8.model
    prompt = [5, 9, 3, 5, 9, 3, 7, 2, 5, 9, 11, 4]
    dec = Decoder(m, m)
    want = [t for e in run_generation(dec, prompt, preset("ar"), 40)[0] for t in e.emitted]
    for s in (preset("sd", draft_len=4), preset("tree", tree=(3, 2, 1)), preset("pld"), preset("hybrid"), preset("mab")):
        evs, _ = run_generation(dec, prompt, s, 40)
        assert [t for e in evs for t in e.emitted] == want, s.label()


@needs_native
def test_q8_needs_gguf_blocks_and_auto_respects_the_switch(tmp_path, monkeypatch):
    """--dtype q8 on a checkpoint without GGUF blocks runs fp32 and says so; SPECCHAT_AUTO_Q8=0
    keeps --dtype auto off q8; formats the kernels do not take never pick it."""
    from engine import dtype_probe
    from engine.loading import load

    from .tiny import saved

    hf = load(str(saved("llama", str(tmp_path))), dtype="q8")
    assert not hf.act8 and hf.compute == "float32"
    monkeypatch.setenv("SPECCHAT_AUTO_Q8", "0")
    assert dtype_probe.auto_q8("llama", {"Q4_1"}) is False
    monkeypatch.setenv("SPECCHAT_AUTO_Q8", "1")
    assert dtype_probe.auto_q8("llama", {"Q4_1", "Q6_K"}) is False
    assert dtype_probe.auto_q8("llama", set()) is False
    c = dtype_probe.q8_costs()
    assert c["fp32"] > 0 and c["q8"] > 0
