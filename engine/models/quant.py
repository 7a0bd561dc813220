"""GGUF block-quantised weights kept quantised on CPU (engine/native/linear.c ``linear_rows_q``).

A GGUF checkpoint's Q4_1 / Q8_0 matrices used to be dequantised to fp32 at load and multiplied
from 4 bytes per weight. The products are memory-bound at the 1-16 rows of decoding and
verification, so here each matrix stays in its GGUF blocks (re-laid out for the kernel: Q4_1 is
4 bits + 2 fp32 scales per 32 weights, 6 bits a weight; Q8_0 9 bits) and is dequantised chunk by
chunk into L1 inside the product. The kernel runs the same FMA chain over the same fp32 weights as
the fp32 path (GGUF's dequantisation ``d * q + m`` is exact up to one rounding, which ``fmaf``
reproduces), so the outputs are bit-identical to the dequantised model's: this is storage, not a
new dtype, and losslessness is untouched (tests/test_quant.py).

Layout (``pack``): column blocks of 16 outputs, each a stream of K / 32 records:
    Q4_1, 384 bytes: float32 d[16], float32 m[16], uint8 q[32][8] with output j < 8 in the low
                     nibble of byte j and output j + 8 in its high nibble;
    Q8_0, 576 bytes: float32 d[16], int8 q[32][16].
Outputs past N are padded with zero scales (zero weights).

The q8 compute type (``--dtype q8``, and ``auto`` where it measures faster: engine/dtype_probe.py)
packs the same blocks as ``Q4_1a8`` / ``Q8_0a8`` records for engine/native/quant_a8.c, which rounds
each row's activations to int8 per 32 inputs and takes exact integer dot products (llama.cpp's CPU
scheme): a dtype of its own, lossless within itself (every row's bits independent of the rows run
with it), not bit-identical to fp32. Layouts in quant_a8.c's header; ``dense()`` and embedding
lookups still give GGUF's exact weights.

The CPU bf16 compute type (``--dtype bf16`` on a CPU with AVX2 + FMA, AVX-512 BF16 or AMX-BF16: ``Llama.keep_bf16``) holds
its weights as ``BF16`` records (``pack_bf16``) for engine/native/bf16_rows.c: bf16 weights,
activations rounded to bf16 per product, fp32 sums (the exact form in that file's header).

Switch: ``SPECCHAT_QUANT=0`` keeps the dequantised fp32 weights (A/B benchmarks).
"""

from __future__ import annotations

import os

import numpy as np
import torch

QTYPES = {"Q4_1": 1, "Q8_0": 2, "Q4_1a8": 3, "Q8_0a8": 4, "BF16": 5}
_RECORD = {"Q4_1": 384, "Q8_0": 576, "Q4_1a8": 320, "Q8_0a8": 544}
_GGUF_BLOCK = {"Q4_1": 20, "Q8_0": 34}  # bytes per 32 weights in the file


def enabled() -> bool:
    return os.environ.get("SPECCHAT_QUANT", "1").strip().lower() not in ("0", "off", "false", "no")


def pack(raw: np.ndarray, qtype: str, K: int, native: bool = True) -> torch.Tensor:
    """GGUF rows -> the kernel's records. ``raw`` is (N, K / 32 * block bytes) uint8, one output
    row per line as stored in the file. Returns a flat uint8 tensor of nb * K / 32 records.
    ``native``: the a8 records through quant_a8.c where it is built (numpy otherwise)."""
    if qtype not in _RECORD:
        raise ValueError(f"unsupported quantisation {qtype}")
    if K % 32:
        raise ValueError(f"K={K} is not a multiple of 32")
    N = raw.shape[0]
    nkb = K // 32
    base = qtype.removesuffix("a8")
    bs = _GGUF_BLOCK[base]
    if raw.shape[1] != nkb * bs:
        raise ValueError(f"{qtype} rows of {raw.shape[1]} bytes, expected {nkb * bs} for K={K}")
    nb = -(-N // 16)
    if qtype != base and native:
        from .. import native as _native

        lib = _native.lib()
        if lib is not None:  # quant_a8.c's a8_pack: the same bytes as _pack_a8, ~30x faster
            raw = np.ascontiguousarray(raw, dtype=np.uint8)
            out = torch.empty(nb * nkb * _RECORD[qtype], dtype=torch.uint8)
            if lib.a8_pack(QTYPES[qtype], raw.ctypes.data, N, K, out.data_ptr()):
                raise ValueError(f"a8_pack failed for {qtype}, K={K}")
            return out
    blocks = np.zeros((nb * 16, nkb, bs), dtype=np.uint8)
    blocks[:N] = raw.reshape(N, nkb, bs)
    blocks = blocks.reshape(nb, 16, nkb, bs).transpose(0, 2, 1, 3)  # (nb, nkb, 16 outputs, bs)
    if qtype != base:
        rec = _pack_a8(blocks, base, nb, nkb)
        assert rec.shape == (nb, nkb, _RECORD[qtype])
        return torch.from_numpy(rec.reshape(-1))
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)  # (nb, nkb, 16)
    if qtype == "Q4_1":
        m = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0].astype(np.float32)
        qs = blocks[..., 4:20]  # (nb, nkb, 16, 16): byte t holds inputs t (low) and t + 16 (high)
        q = np.concatenate([qs & 15, qs >> 4], axis=-1)  # (nb, nkb, 16 outputs, 32 inputs)
        q = q.transpose(0, 1, 3, 2)  # (nb, nkb, 32 inputs, 16 outputs)
        qb = (q[..., :8] | (q[..., 8:] << 4)).astype(np.uint8)  # (nb, nkb, 32, 8)
        rec = np.concatenate([d.view(np.uint8), m.view(np.uint8), qb.reshape(nb, nkb, 256)], axis=-1)
    else:
        q = np.ascontiguousarray(blocks[..., 2:34]).view(np.int8).transpose(0, 1, 3, 2)  # (nb, nkb, 32, 16)
        rec = np.concatenate([d.view(np.uint8), np.ascontiguousarray(q).view(np.uint8).reshape(nb, nkb, 512)], axis=-1)
    rec = np.ascontiguousarray(rec)
    assert rec.shape == (nb, nkb, _RECORD[qtype])
    return torch.from_numpy(rec.reshape(-1))


def _pack_a8(blocks: np.ndarray, base: str, nb: int, nkb: int) -> np.ndarray:
    """quant_a8.c's records (the q8 compute type) from (nb, nkb, 16 outputs, GGUF block) bytes: the
    fp16 scales as stored, then the weights with four consecutive inputs of an output together."""
    d16 = np.ascontiguousarray(blocks[..., 0:2]).reshape(nb, nkb, 32)  # fp16 d[16], as in the file
    if base == "Q4_1":
        m16 = np.ascontiguousarray(blocks[..., 2:4]).reshape(nb, nkb, 32)
        qs = blocks[..., 4:20]
        q = np.concatenate([qs & 15, qs >> 4], axis=-1)  # (nb, nkb, 16 outputs, 32 inputs)
        q = q.reshape(nb, nkb, 16, 4, 2, 4)  # inputs 8 g + 4 half + k
        lo = q[:, :, :, :, 0, :].transpose(0, 1, 3, 2, 4)  # (nb, nkb, g, j, k)
        hi = q[:, :, :, :, 1, :].transpose(0, 1, 3, 2, 4)
        w = (lo | (hi << 4)).astype(np.uint8).reshape(nb, nkb, 256)
        return np.ascontiguousarray(np.concatenate([d16, m16, w], axis=-1))
    q = np.ascontiguousarray(blocks[..., 2:34]).reshape(nb, nkb, 16, 8, 4)  # inputs 4 h + k
    w = q.transpose(0, 1, 3, 2, 4).reshape(nb, nkb, 512)  # (h, j, k)
    return np.ascontiguousarray(np.concatenate([d16, w], axis=-1))


def pack_bf16(w: torch.Tensor) -> torch.Tensor:
    """An [N, K] weight (K even) -> bf16_rows.c's records: rounded to bf16 (to nearest even, as
    torch's cast), column blocks of 16 outputs zero-padded, in each block K / 2 vectors whose lane
    j holds (w[2p][j], w[2p + 1][j]). A flat uint8 tensor of nb * K * 32 bytes."""
    N, K = w.shape
    if K % 2:
        raise ValueError(f"K={K} is odd")
    nb = -(-N // 16)
    wp = torch.zeros(nb * 16, K, dtype=torch.bfloat16)
    wp[:N] = w.detach()
    return wp.view(nb, 16, K // 2, 2).permute(0, 2, 1, 3).contiguous().view(torch.uint8).reshape(-1)


def dequantize_rows(records: torch.Tensor, qtype: str, N: int, K: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of the [N, K] matrix held as records, as fp32 (n, K)."""
    from .. import native

    ids = ids.to(torch.int64).contiguous()
    out = torch.empty(ids.shape[0], K, dtype=torch.float32)
    rc = native.lib().quant_rows_f32(records.data_ptr(), QTYPES[qtype], N, K, ids.data_ptr(), ids.shape[0], out.data_ptr())
    if rc:
        raise ValueError(f"quant_rows_f32 failed ({rc})")
    return out


def gguf_blocks(raw: np.ndarray, qtype: str) -> np.ndarray:
    """Dequantise GGUF rows with the gguf package (the reference the kernel must match)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    return np.asarray(dequantize(raw, GGMLQuantizationType[qtype]), dtype=np.float32)


def quantize_rows(w: torch.Tensor, qtype: str) -> np.ndarray:
    """An [N, K] fp32 matrix quantised as the gguf package does (GGUF rows, as ``pack`` takes them).
    Q8_0 goes through ``_q8_0_rows`` (the same bytes, ~10x faster: a drafter's load quantises
    ~25M weights); other types through gguf.quants."""
    w = w.detach().float()
    if qtype == "Q8_0" and w.dim() == 2 and w.shape[1] % 32 == 0:
        return _q8_0_rows(w)
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quantize

    return quantize(w.numpy(), GGMLQuantizationType[qtype])


def _q8_0_rows(w: torch.Tensor, chunk: int = 4096) -> np.ndarray:
    """GGUF Q8_0 rows of an [N, K] fp32 matrix, operation for operation gguf.quants.Q8_0
    (ggml-quants.c's reference): per 32-weight block d = max|x| / 127, q = roundf(x * (1 / d))
    (half away from zero; 0 where d = 0), d stored as fp16 before the 32 int8. Every step is one
    IEEE fp32 operation, so the bytes are gguf's (tested on random and tie-making blocks): in C
    (quant_a8.c's q8_0_quantize, one pass) where it is built, else in torch."""
    from .. import native

    N, K = w.shape
    nkb = K // 32
    out = torch.empty(N, nkb, 34, dtype=torch.uint8)
    lib = native.lib()
    if lib is not None:
        w = w.contiguous()
        d = torch.empty(N, nkb, 1, dtype=torch.float32)
        if lib.q8_0_quantize(w.data_ptr(), N, K, out.data_ptr(), d.data_ptr()):
            raise ValueError(f"q8_0_quantize failed for K={K}")
        out[:, :, :2] = d.half().view(torch.uint8)
        return out.reshape(N, nkb * 34).numpy()
    for s in range(0, N, chunk):  # bounded temporaries (a 49,152-row head at once would be ~200 MB)
        b = w[s : s + chunk].reshape(-1, nkb, 32)
        d = b.abs().amax(dim=2, keepdim=True) / 127
        inv = torch.where(d == 0, torch.zeros((), dtype=d.dtype), 1 / d)
        x = b * inv
        a = x.abs()
        f = a.floor()
        q = torch.copysign(f + (2 * (a - f)).floor(), x)  # np_roundf: sign(x) * (floor|x| + floor(2 frac))
        o = out[s : s + chunk]
        o[:, :, :2] = d.half().view(torch.uint8)
        o[:, :, 2:] = q.to(torch.int8).view(torch.uint8)
    return out.reshape(N, nkb * 34).numpy()
