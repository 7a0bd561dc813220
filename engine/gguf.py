"""GGUF files -> an HF-style checkpoint: config dict, float32 state dict in transformers naming,
and the tokenizer from the file's metadata.

    ck = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    ck.config["num_hidden_layers"], ck.state_dict["model.layers.0.self_attn.q_proj.weight"].shape, ck.quant

The header is parsed here (not with ``gguf.GGUFReader``) so that every length is checked against
the file size before it is used: a truncated or corrupt file raises ``ModelLoadError`` with one
line, and a garbage count cannot send the parser into a huge loop. Tensor data is memory-mapped
and dequantised with ``gguf.quants``' formulas (``dequantize_raw`` for Q4_1 / Q8_0, over larger
chunks; ``gguf.quants.dequantize`` for the rest). ``load_gguf(defer=True)`` skips the fp32 copies
of the matrices the CPU engine multiplies from their blocks (engine/models/quant.py).

Layout (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, the
key/value metadata, the tensor directory (name, n_dims, dims ne0..ne{n-1}, u32 type, u64 offset),
then tensor data starting at the next multiple of ``general.alignment`` (default 32). ggml writes
dims fastest-first, so numpy shape = reversed(dims): a [out, in] matrix has ne0 = in.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import ModelLoadError
from .tokenizer import Tokenizer

GGUF_MAGIC = b"GGUF"
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")

_STRING, _ARRAY = 8, 9
# GGUF value type -> (struct format, numpy dtype) for the fixed-size types.
_SCALAR = {
    0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.dtype("<u2")), 3: ("<h", np.dtype("<i2")),
    4: ("<I", np.dtype("<u4")), 5: ("<i", np.dtype("<i4")), 6: ("<f", np.dtype("<f4")), 7: ("<?", np.bool_),
    10: ("<Q", np.dtype("<u8")), 11: ("<q", np.dtype("<i8")), 12: ("<d", np.dtype("<f8")),
}
_MAX_DIMS = 4  # GGML_MAX_DIMS


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy / HF order: reversed ggml dims, e.g. (out, in)
    qtype: Any  # gguf.GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    nbytes: int


class GGUFFile:
    """A parsed GGUF header (``metadata``, ``tensors``) over a memory map of the file.

    Use as a context manager, or call ``close()``; ``read_tensor`` returns fresh float32 arrays
    that do not keep the map alive.
    """

    def __init__(self, path: Path, mm: mmap.mmap, version: int, metadata: dict[str, Any],
                 tensors: dict[str, GGUFTensorInfo]):
        self.path, self._mm, self.version = path, mm, version
        self.metadata, self.tensors = metadata, tensors

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a caller still holds a view; the map goes when it does
                pass
            self._mm = None

    def read_tensor(self, name: str) -> np.ndarray:
        """The tensor dequantised to float32, in numpy order (``info.shape``)."""
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import dequantize

        info = self.tensors[name]
        raw = np.frombuffer(self._mm, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        q = info.qtype
        try:
            if q == GGMLQuantizationType.F32:
                out = raw.view("<f4").reshape(info.shape).copy()
            elif q == GGMLQuantizationType.F16:
                out = raw.view("<f2").astype(np.float32).reshape(info.shape)
            elif q == GGMLQuantizationType.F64:
                out = raw.view("<f8").astype(np.float32).reshape(info.shape)
            else:
                block, type_size = GGML_QUANT_SIZES[q]
                ne0 = info.shape[-1]
                rows = raw.reshape(-1, ne0 // block * type_size)  # (rows, bytes per row)
                if q.name in _FAST_DEQUANT:
                    out = dequantize_raw(rows, q.name).reshape(info.shape)
                else:
                    out = np.asarray(dequantize(rows, q), dtype=np.float32).reshape(info.shape)
        except NotImplementedError:
            raise ModelLoadError(f"tensor {name} has type {q.name}, which this gguf package cannot dequantise", path=self.path) from None
        finally:
            del raw
        return out

    def read_blocks(self, name: str) -> np.ndarray:
        """A 2-D tensor's raw quantised blocks, (rows, bytes per row) uint8, copied out of the map."""
        from gguf.constants import GGML_QUANT_SIZES

        info = self.tensors[name]
        block, type_size = GGML_QUANT_SIZES[info.qtype]
        raw = np.frombuffer(self._mm, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        try:
            return raw.reshape(info.shape[0], info.shape[1] // block * type_size).copy()
        finally:
            del raw


_FAST_DEQUANT = ("Q4_1", "Q8_0")


def dequantize_raw(rows: np.ndarray, qtype: str, chunk: int = 2048) -> np.ndarray:
    """Q4_1 / Q8_0 rows (rows, bytes per row) -> float32 (rows, weights per row), the same
    operations as ``gguf.quants`` (so the same bits: tests/test_gguf.py) over chunks of ``chunk``
    rows instead of its groups of 16: SmolLM2's 49,152 x 576 embedding 0.6 s -> ~0.1 s."""
    bs = 20 if qtype == "Q4_1" else 34
    n, nbytes = rows.shape
    out = np.empty((n, nbytes // bs * 32), dtype=np.float32)
    shifts = np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    for a in range(0, n, chunk):
        b = rows[a:a + chunk].reshape(-1, bs)  # (blocks, bytes)
        d = np.ascontiguousarray(b[:, 0:2]).view(np.float16).astype(np.float32)
        if qtype == "Q4_1":
            m = np.ascontiguousarray(b[:, 2:4]).view(np.float16).astype(np.float32)
            qs = (b[:, 4:].reshape(-1, 1, 1, 16) >> shifts) & np.uint8(15)
            w = d * qs.reshape(-1, 32).astype(np.float32) + m
        else:
            w = np.ascontiguousarray(b[:, 2:]).view(np.int8).astype(np.float32) * d
        out[a:a + chunk] = w.reshape(-1, out.shape[1])
    return out


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse the header of a GGUF file; tensor data stays on disk (memory-mapped)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size == 0:
            raise ModelLoadError("file is empty (not a GGUF file)", path=p)
        with open(p, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise ModelLoadError(f"cannot open ({e.strerror or e})", path=p) from None
    try:
        version, metadata, tensors = _parse_header(mm, size, p)
    except ModelLoadError:
        mm.close()
        raise
    except Exception as e:  # parsing is bounds-checked; anything else still gets one line
        mm.close()
        raise ModelLoadError(f"corrupt GGUF header ({type(e).__name__}: {e})", path=p) from None
    return GGUFFile(p, mm, version, metadata, tensors)


class _Cursor:
    """Bounds-checked little-endian reads from the header."""

    def __init__(self, buf: mmap.mmap, size: int, path: Path):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelLoadError(f"header is truncated or corrupt: {what} at byte {self.pos} needs {n} bytes, "
                                 f"the file has {self.size - self.pos} left", path=self.path)

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        self.need(n, what)
        s = self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def strings(self, n: int, what: str) -> list[str]:
        """``n`` strings in a row (a tokenizer's vocabulary and merges: ~100k), in one tight loop."""
        buf, size, pos, unpack = self.buf, self.size, self.pos, struct.Struct("<Q").unpack_from
        out = []
        append = out.append
        for _ in range(n):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, what)
            (k,) = unpack(buf, pos)
            pos += 8
            if pos + k > size:
                self.pos = pos
                self.need(k, what)
            append(buf[pos:pos + k].decode("utf-8", errors="replace"))
            pos += k
        self.pos = pos
        return out

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALAR:
            v = self.scalar(_SCALAR[vtype][0], what)
            return bool(v) if vtype == 7 else v
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            etype = self.scalar("<I", what)
            n = self.scalar("<Q", what)
            if etype in _SCALAR:
                dt = np.dtype(_SCALAR[etype][1])
                self.need(n * dt.itemsize, f"{what} ({n} items)")
                arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos)
                self.pos += n * dt.itemsize
                out = arr.tolist()
                del arr
                return out
            if etype in (_STRING, _ARRAY):
                self.need(n * 8, f"{what} ({n} items)")  # every item has at least a u64 length
                if etype == _STRING:
                    return self.strings(n, what)
                return [self.value(etype, what) for _ in range(n)]
            raise ModelLoadError(f"corrupt GGUF header: {what} has unknown array item type {etype}", path=self.path)
        raise ModelLoadError(f"corrupt GGUF header: {what} has unknown value type {vtype}", path=self.path)


def _parse_header(mm: mmap.mmap, size: int, path: Path) -> tuple[int, dict[str, Any], dict[str, GGUFTensorInfo]]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    c = _Cursor(mm, size, path)
    magic = bytes(mm[:4])
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})", path=path)
    c.pos = 4
    version = c.scalar("<I", "version")
    if version not in (2, 3):
        if version & 0xFFFF == 0 and (version >> 16):
            raise ModelLoadError("big-endian GGUF files are not supported", path=path)
        raise ModelLoadError(f"GGUF version {version} is not supported (2 or 3)", path=path)
    n_tensors = c.scalar("<Q", "tensor count")
    n_kv = c.scalar("<Q", "metadata count")
    # Each key/value takes at least 8 + 4 + 1 bytes and each tensor entry 8 + 4 + 4 + 8 bytes.
    c.need(n_kv * 13 + n_tensors * 24, f"{n_kv} metadata entries and {n_tensors} tensor entries")

    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string("metadata key")
        vtype = c.scalar("<I", f"type of {key!r}")
        metadata[key] = c.value(vtype, repr(key))

    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ModelLoadError(f"corrupt GGUF header: general.alignment = {alignment!r} is not a power of two", path=path)

    infos = []
    for _ in range(n_tensors):
        name = c.string("tensor name")
        n_dims = c.scalar("<I", f"dims of {name}")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise ModelLoadError(f"corrupt GGUF header: tensor {name!r} has {n_dims} dims", path=path)
        dims = [c.scalar("<Q", f"dims of {name}") for _ in range(n_dims)]
        raw_type = c.scalar("<I", f"type of {name}")
        offset = c.scalar("<Q", f"offset of {name}")
        try:
            qtype = GGMLQuantizationType(raw_type)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ModelLoadError(f"tensor {name!r} has unknown ggml type {raw_type} (corrupt, or newer than this gguf package)", path=path) from None
        if dims[0] % block:
            raise ModelLoadError(f"corrupt GGUF header: tensor {name!r} row of {dims[0]} is not a multiple of the {qtype.name} block ({block})", path=path)
        nbytes = math.prod(dims) // block * type_size
        infos.append((name, tuple(reversed(dims)), qtype, offset, nbytes))

    data_start = (c.pos + alignment - 1) // alignment * alignment
    tensors: dict[str, GGUFTensorInfo] = {}
    for name, shape, qtype, offset, nbytes in infos:
        start = data_start + offset
        if start + nbytes > size:
            raise ModelLoadError(f"tensor data is truncated: {name} needs bytes {start}..{start + nbytes} but the file "
                                 f"has {size} (incomplete download?)", path=path)
        if name in tensors:
            raise ModelLoadError(f"corrupt GGUF header: tensor {name!r} appears twice", path=path)
        if offset % alignment:  # ggml writes every tensor's data at a multiple of the alignment
            raise ModelLoadError(f"corrupt GGUF header: tensor {name!r} at offset {offset}, not a multiple of "
                                 f"general.alignment ({alignment})", path=path)
        tensors[name] = GGUFTensorInfo(name, shape, qtype, start, nbytes)
    # tensors' bytes never share a byte (a changed type or offset would read another tensor's data)
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values() if t.nbytes)
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise ModelLoadError(f"corrupt GGUF header: tensors {a!r} and {b!r} overlap in the file", path=path)
    return version, metadata, tensors


# ---------------------------------------------------------------------------------------------
# Checkpoint
# ---------------------------------------------------------------------------------------------
@dataclass
class GGUFCheckpoint:
    config: dict[str, Any]  # HF config.json fields
    state_dict: dict[str, torch.Tensor]  # float32, transformers names and [out, in] shapes
    tokenizer: Tokenizer
    quant: str  # "Q4_1", "Q8_0", "F16", ...
    path: Path
    metadata: dict[str, Any] = field(default_factory=dict, repr=False)
    # HF name -> (qtype, raw GGUF rows) for the Q4_1 / Q8_0 matrices (rows in HF order, q/k
    # unpermuted): what engine/models/quant.py keeps instead of the fp32 copy
    blocks: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict, repr=False)
    # load_gguf(defer=True): HF name -> (gguf name, RoPE permutation) of the matrices whose
    # state_dict entry is a "meta" placeholder (shape only) until ``materialize()``
    deferred: dict[str, tuple[str, str | None]] = field(default_factory=dict, repr=False)
    stamp: tuple[int, int] | None = None  # the file's (size, mtime_ns) when loaded: materialize() reads the same file

    def materialize(self) -> None:
        """Dequantise the deferred matrices into ``state_dict`` (the fp32 weights ``defer`` skipped)."""
        if not self.deferred:
            return
        if self.stamp is not None and _stamp(self.path) != self.stamp:
            raise ModelLoadError("the file changed after it was loaded (replaced or rewritten?): load it again", path=self.path)
        with read_gguf(self.path) as f:
            for hname, (gname, perm) in self.deferred.items():
                if gname is None:  # TIED_HEAD_PLACEHOLDER: the head is the embedding again
                    del self.state_dict[hname]
                    continue
                try:
                    self.state_dict[hname] = torch.from_numpy(_read_weight(f, gname, perm, self.config))
                except (ValueError, TypeError, KeyError, IndexError) as e:
                    raise ModelLoadError(f"cannot read tensor {gname} ({type(e).__name__}: {e})", path=self.path) from None
        self.deferred = {}


# (gguf tensor suffix, HF suffix) per layer; "q"/"k" mark the rows llama.cpp permuted for RoPE.
_LAYER_TENSORS = (
    ("attn_norm.weight", "input_layernorm.weight", None),
    ("ffn_norm.weight", "post_attention_layernorm.weight", None),
    ("attn_q.weight", "self_attn.q_proj.weight", "q"),
    ("attn_k.weight", "self_attn.k_proj.weight", "k"),
    ("attn_v.weight", "self_attn.v_proj.weight", None),
    ("attn_output.weight", "self_attn.o_proj.weight", None),
    ("ffn_gate.weight", "mlp.gate_proj.weight", None),
    ("ffn_up.weight", "mlp.up_proj.weight", None),
    ("ffn_down.weight", "mlp.down_proj.weight", None),
)
_BIASES = (
    ("attn_q.bias", "self_attn.q_proj.bias", "q"),
    ("attn_k.bias", "self_attn.k_proj.bias", "k"),
    ("attn_v.bias", "self_attn.v_proj.bias", None),
    ("attn_output.bias", "self_attn.o_proj.bias", None),
)


# load_gguf(defer=True) of a tied-embedding model: a placeholder for the output layer the engine
# takes from the embedding's blocks (engine/models/llama.py), so no fp32 head is built to be dropped
TIED_HEAD_PLACEHOLDER = "lm_head.weight"


def load_gguf(path: str | os.PathLike, defer: bool = False) -> GGUFCheckpoint:
    """Load a llama- or qwen2-architecture GGUF as an HF-style float32 checkpoint.

    ``defer``: the matrices whose raw blocks are kept (``blocks``) are not dequantised; their
    state_dict entries are "meta" tensors (shape only) until ``ck.materialize()``. The engine's
    quantised CPU path (engine/models/quant.py) multiplies from the blocks and never reads those
    fp32 copies: this skips ~3 s of SmolLM2's load (Python dequantisation, transposes, fp32 layouts)."""
    p = Path(path)
    stamp = _stamp(p)
    with read_gguf(p) as f:
        md = f.metadata
        parts = md.get("split.count")
        if isinstance(parts, int) and not isinstance(parts, bool) and parts > 1:  # llama.cpp's gguf-split
            part = md.get("split.no")
            which = f"part {part + 1} of {parts}" if isinstance(part, int) and 0 <= part < parts else f"one of {parts} parts"
            raise ModelLoadError(f"{which} of a split GGUF model; split files are not supported: merge the parts into one "
                                 "file first (llama.cpp: llama-gguf-split --merge FIRST-PART.gguf MERGED.gguf)", path=p)
        arch = md.get("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(f"architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})", path=p)
        try:
            tokenizer = Tokenizer.from_gguf(f)
            config = _hf_config(md, arch, p)
            state_dict, rope_freqs, blocks, deferred = _state_dict(f, arch, config, p, defer)
            if rope_freqs is not None:
                config["rope_scaling"] = _llama3_scaling_from_rope_freqs(rope_freqs, config, md, p)
        except ModelLoadError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, ArithmeticError, struct.error) as e:
            # Metadata that parsed but makes no sense (a flipped byte in a count, a wrong type).
            raise ModelLoadError(f"corrupt or inconsistent GGUF ({type(e).__name__}: {e})", path=p) from e
        config["vocab_size"] = state_dict["model.embed_tokens.weight"].shape[0]
        config["tie_word_embeddings"] = "output.weight" not in f.tensors
        if defer and config["tie_word_embeddings"] and "model.embed_tokens.weight" in blocks:
            state_dict[TIED_HEAD_PLACEHOLDER] = torch.empty(state_dict["model.embed_tokens.weight"].shape, device="meta")
            deferred[TIED_HEAD_PLACEHOLDER] = (None, None)
        return GGUFCheckpoint(config, state_dict, tokenizer, _quant_name(f), p, md, blocks, deferred, stamp)


def _hf_config(md: dict[str, Any], arch: str, path: Path) -> dict[str, Any]:
    def get(key: str, default: Any = ...) -> Any:
        v = md.get(f"{arch}.{key}", default)
        if v is ...:
            raise ModelLoadError(f"metadata lacks {arch}.{key}", path=path)
        if isinstance(v, list):
            raise ModelLoadError(f"{arch}.{key} varies per layer, which is not supported", path=path)
        return v

    def count(key: str, default: Any = ...) -> int:
        v = get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 1 << 24:
            raise ModelLoadError(f"{arch}.{key} = {v!r} is not a plausible size (corrupt metadata?)", path=path)
        return v

    if md.get(f"{arch}.expert_count"):
        raise ModelLoadError("mixture-of-experts GGUF files are not supported", path=path)
    hidden, heads = count("embedding_length"), count("attention.head_count")
    kv_heads = count("attention.head_count_kv", heads)
    head_dim = count("attention.key_length", max(hidden // heads, 1))
    if heads % kv_heads:
        raise ModelLoadError(f"{heads} attention heads is not a multiple of {kv_heads} kv heads (corrupt metadata?)", path=path)
    if count("attention.value_length", head_dim) != head_dim:
        raise ModelLoadError("key and value head sizes differ, which is not supported", path=path)
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": count("feed_forward_length"),
        "num_hidden_layers": count("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5 if arch == "llama" else 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": count("context_length", 2048),
        "vocab_size": int(get("vocab_size", len(md.get("tokenizer.ggml.tokens") or []))),
        "bos_token_id": md.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": md.get("tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }
    if md.get("tokenizer.ggml.padding_token_id") is not None:
        cfg["pad_token_id"] = md["tokenizer.ggml.padding_token_id"]
    rot = count("rope.dimension_count", head_dim)
    if rot > head_dim or rot % 2:
        raise ModelLoadError(f"{arch}.rope.dimension_count = {rot} does not fit heads of {head_dim} (corrupt metadata?)", path=path)
    if rot != head_dim:
        cfg["partial_rotary_factor"] = rot / head_dim
    kind = get("rope.scaling.type", None)
    factor = get("rope.scaling.factor", None) or get("rope.scale_linear", None)
    if kind in (None, "linear") and factor and float(factor) != 1.0:
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(factor)}
    elif kind == "yarn":
        cfg["rope_scaling"] = {"rope_type": "yarn", "factor": float(factor or 1.0),
                               "original_max_position_embeddings": int(get("rope.scaling.original_context_length", cfg["max_position_embeddings"]))}
        for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"), ("attn_factor", "attention_factor")):
            if get(f"rope.scaling.{gguf_key}", None) is not None:
                cfg["rope_scaling"][hf_key] = float(get(f"rope.scaling.{gguf_key}"))
    elif kind not in (None, "none", "linear"):
        raise ModelLoadError(f"rope scaling {kind!r} is not supported (linear, yarn)", path=path)
    if arch == "qwen2" and get("attention.sliding_window", None):
        cfg["sliding_window"] = int(get("attention.sliding_window"))
    return cfg


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's RoPE row permutation of q/k (convert_hf_to_gguf.py ``LlamaModel.permute``).

    HF's RoPE rotates half-dims (i, i + E/2) of each head; ggml's llama RoPE rotates adjacent
    pairs (2i, 2i + 1). The converter therefore reorders each head's E rows from
    [x0..x_{E/2-1}, y0..y_{E/2-1}] to [x0, y0, x1, y1, ...]: reshape (H, 2, E/2) -> swap -> (H, E/2, 2).
    The inverse reads rows as (H, E/2, 2) and swaps back to (H, 2, E/2).
    """
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_KEPT_QUANTS = ("Q4_1", "Q8_0")  # the block formats engine/native/linear.c multiplies directly


def _hf_rows(a: np.ndarray, perm: str | None, cfg: dict[str, Any]) -> np.ndarray:
    """A matrix's rows (fp32 weights or raw blocks) in HF order: q/k ("q"/"k") unpermuted."""
    if perm is None:
        return a
    return np.ascontiguousarray(_unpermute(a, cfg["num_attention_heads"] if perm == "q" else cfg["num_key_value_heads"]))


def _read_weight(f: GGUFFile, gname: str, perm: str | None, cfg: dict[str, Any]) -> np.ndarray:
    """A tensor dequantised to fp32 in HF order (q/k rows unpermuted)."""
    return _hf_rows(f.read_tensor(gname), perm, cfg)


def _state_dict(f: GGUFFile, arch: str, cfg: dict[str, Any], path: Path, defer: bool = False
                ) -> tuple[dict[str, torch.Tensor], np.ndarray | None, dict[str, tuple[str, np.ndarray]], dict[str, tuple[str, str | None]]]:
    heads, kv_heads, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    permuted = arch == "llama"  # qwen2 uses NeoX-style RoPE in ggml: stored as in HF
    plan: dict[str, tuple[str, str | None]] = {  # gguf name -> (HF name, permutation)
        "token_embd.weight": ("model.embed_tokens.weight", None),
        "output_norm.weight": ("model.norm.weight", None),
    }
    required = set(plan)
    n_layers = cfg["num_hidden_layers"]
    if n_layers * len(_LAYER_TENSORS) > len(f.tensors):  # a corrupt block_count must not build a huge plan
        have = next(i for i in range(n_layers) if any(f"blk.{i}.{g}" not in f.tensors for g, _, _ in _LAYER_TENSORS))
        raise ModelLoadError(f"{arch}.block_count is {n_layers} but the file has the tensors of only {have} blocks "
                             "(corrupt metadata, or incomplete file)", path=path)
    for i in range(n_layers):
        for g, h, perm in _LAYER_TENSORS:
            plan[f"blk.{i}.{g}"] = (f"model.layers.{i}.{h}", perm if permuted else None)
            required.add(f"blk.{i}.{g}")
        for g, h, perm in _BIASES:
            plan[f"blk.{i}.{g}"] = (f"model.layers.{i}.{h}", perm if permuted else None)
            if arch == "qwen2" and g != "attn_output.bias":
                required.add(f"blk.{i}.{g}")
    if "output.weight" in f.tensors:
        plan["output.weight"] = ("lm_head.weight", None)

    missing = sorted(required - set(f.tensors), key=_natural)
    if missing:
        raise ModelLoadError(f"tensor {missing[0]!r} is missing ({len(missing)} missing: incomplete file, or not a {arch} checkpoint)", path=path)
    ignored = {"rope_freqs.weight"} | {n for n in f.tensors if n.endswith(".attn_rot_embd")}
    unknown = sorted(set(f.tensors) - set(plan) - ignored, key=_natural)
    if unknown:
        raise ModelLoadError(f"unexpected tensor {unknown[0]!r} ({len(unknown)} unknown): a {arch} variant this loader does not support", path=path)
    if arch == "llama":
        # HF llama has one attention_bias flag for q, k, v and o together.
        biased = {g for g in (b[0] for b in _BIASES) if f"blk.0.{g}" in f.tensors}
        if biased and len(biased) != len(_BIASES):
            raise ModelLoadError(f"attention biases only on {sorted(biased)}: not representable as an HF llama (attention_bias covers q, k, v, o)", path=path)
        if biased:
            cfg["attention_bias"] = True

    D, F, E = cfg["hidden_size"], cfg["intermediate_size"], head_dim
    V = f.tensors["token_embd.weight"].shape[0]
    want = {"token_embd": (V, D), "output": (V, D), "output_norm": (D,), "attn_norm": (D,), "ffn_norm": (D,),
            "attn_q": (heads * E, D), "attn_k": (kv_heads * E, D), "attn_v": (kv_heads * E, D), "attn_output": (D, heads * E),
            "ffn_gate": (F, D), "ffn_up": (F, D), "ffn_down": (D, F)}
    sd: dict[str, torch.Tensor] = {}
    blocks: dict[str, tuple[str, np.ndarray]] = {}
    deferred: dict[str, tuple[str, str | None]] = {}
    for gname, (hname, perm) in plan.items():
        if gname not in f.tensors:
            continue
        stem, kind = gname.rsplit(".", 1)[0].rsplit(".", 1)[-1], gname.rsplit(".", 1)[1]
        shape = want[stem] if kind == "weight" else want[stem][:1]
        if f.tensors[gname].shape != shape:
            raise ModelLoadError(f"tensor {gname} has shape {list(f.tensors[gname].shape)}, the config implies {list(shape)}", path=path)
        qname = f.tensors[gname].qtype.name
        kept = kind == "weight" and len(shape) == 2 and qname in _KEPT_QUANTS and shape[1] % 32 == 0
        if kept:
            blocks[hname] = (qname, _hf_rows(f.read_blocks(gname), perm, cfg))
        if kept and defer and hname != "model.embed_tokens.weight":  # the embedding's rows are looked up in fp32
            sd[hname] = torch.empty(shape, device="meta")
            deferred[hname] = (gname, perm)
        else:
            sd[hname] = torch.from_numpy(_read_weight(f, gname, perm, cfg))
    rope_freqs = f.read_tensor("rope_freqs.weight") if "rope_freqs.weight" in f.tensors else None
    return sd, rope_freqs, blocks, deferred


def _llama3_scaling_from_rope_freqs(ff: np.ndarray, cfg: dict[str, Any], md: dict[str, Any], path: Path) -> dict[str, Any]:
    """Recover Llama 3.1-style ``rope_scaling`` from the per-frequency divisors llama.cpp stores.

    The converter writes ff[i] = 1 (short wavelengths), ``factor`` (long ones) or, in between,
    1 / ((1 - s) / factor + s) with s = (orig / wavelen - low) / (high - low). s is linear in
    1 / wavelen, so the in-between entries give orig / (high - low) and low / (high - low); only
    those ratios matter, so orig is taken from the metadata (or 8192) and low/high follow.
    The result is checked by regenerating the divisors.
    """
    ff = np.asarray(ff, dtype=np.float64).ravel()
    dim = int(round(cfg["head_dim"] * cfg.get("partial_rotary_factor", 1.0)))
    base = cfg["rope_theta"]
    inv = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if ff.shape[0] != inv.shape[0]:
        raise ModelLoadError(f"rope_freqs has {ff.shape[0]} entries, expected {inv.shape[0]}", path=path)
    factor = float(ff.max())
    orig = float(md.get("llama.rope.scaling.original_context_length") or 8192)
    wavelen = 2 * math.pi / inv
    mid = (ff > 1 + 1e-6) & (ff < factor - 1e-6)
    if factor <= 1.0 + 1e-6:
        return {}
    if mid.sum() >= 2:
        s = (1 / ff[mid] - 1 / factor) / (1 - 1 / factor)
        a, b = np.polyfit(1 / wavelen[mid], s, 1)  # s = a / wavelen + b
        span = orig / a
        low = -b * span
        high = low + span
    else:
        low, high = 1.0, 4.0  # Llama 3.1's values; the check below decides if they fit
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": float(low), "high_freq_factor": float(high),
               "original_max_position_embeddings": int(orig)}
    smooth = (orig / wavelen - low) / (high - low)
    redo = np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor, 1 / ((1 - smooth) / factor + smooth)))
    if not np.allclose(redo, ff, rtol=1e-4, atol=1e-5):
        raise ModelLoadError("rope_freqs tensor does not match Llama 3 rope scaling; this RoPE variant is not supported", path=path)
    return scaling


def _quant_name(f: GGUFFile) -> str:
    from gguf.constants import LlamaFileType

    ft = f.metadata.get("general.file_type")
    try:
        name = LlamaFileType(ft).name
        if name != "GUESSED":
            return name.replace("MOSTLY_", "").replace("ALL_", "")
    except (ValueError, TypeError):
        pass
    counts = Counter(t.qtype.name for t in f.tensors.values() if len(t.shape) >= 2)
    return counts.most_common(1)[0][0] if counts else "F32"


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _natural(name: str) -> tuple:
    return tuple((0, int(x), "") if x.isdigit() else (1, 0, x) for x in name.split("."))
