"""``--dtype auto``: bf16 where a start-up micro-benchmark shows it is faster on this machine.

On CPUs the answer depends on the instruction set (AVX2 converts bf16 in software, AMX/AVX-512
BF16 do not) and on the weight layout, so it is measured, not assumed: products of the shapes a
decode step and a verify pass are made of (a projection and a vocabulary-sized head slice, 1 row
and 8 rows), each in the layout the engine uses for that dtype (engine/models/common.as_t). CUDA
is always bf16.

The measures are remembered per machine (``$XDG_CACHE_HOME/specchat/dtype-probe.json``, keyed by
the CPU's flags, torch's version and the C kernels' sources): the compute type, and with it every
greedy reply, must not change from one launch to the next because the machine was busy during one
probe. Measured before: the 8-bit product probe alone, five runs of ~0.2 ms products, found q8
2.2x faster, then 1.3x and 1.1x slower in three processes on an idle 2-core AVX2 EPYC, and a
tester saw one launch in eight start in fp32. The products now run interleaved, several to a
timing, the minimum over rounds. ``SPECCHAT_REPROBE=1`` measures again (and remembers that).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

PROBE_VERSION = 2  # bump when what a probe measures changes: older remembered measures are ignored


def _probe_file() -> Path:
    from . import native

    return native._cache_dir().parent / "dtype-probe.json"


@functools.lru_cache(maxsize=None)
def _machine_key() -> str:
    from . import native

    h = hashlib.sha256(f"{PROBE_VERSION}|{torch.__version__}|{native._cpu_key()}".encode())
    for src in native.SOURCES:  # the kernels' speed is what q8_costs measures
        try:
            h.update((Path(native.__file__).parent / src).read_bytes())
        except OSError:
            pass
    return h.hexdigest()[:24]


def _remembered(name: str, measure: Callable[[], dict[str, float]]) -> dict[str, float]:
    """``measure()``'s result as first measured on this machine (see the module docstring), or
    measured now and written down. An unreadable, damaged or unwritable file only means measuring."""
    path, key = _probe_file(), _machine_key()
    try:
        book = json.loads(path.read_text())
        if not isinstance(book, dict):
            book = {}
    except (OSError, ValueError):
        book = {}
    mine = book.get(key) if isinstance(book.get(key), dict) else {}
    got = mine.get(name)
    reprobe = os.environ.get("SPECCHAT_REPROBE", "").strip().lower() in ("1", "on", "true", "yes")
    if (not reprobe and isinstance(got, dict) and got
            and all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in got.values())):
        return {k: float(v) for k, v in got.items()}
    got = measure()
    book[key] = {**mine, name: got}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(book, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass
    return got


def _interleaved(fns: dict[str, Callable[[], object]], rounds: int = 7, inner: int = 4) -> dict[str, float]:
    """Seconds per call of each function: ``inner`` calls to a timing, the functions taking turns
    for ``rounds`` rounds, the minimum kept (a busy moment slows one timing, not the verdict)."""
    for f in fns.values():
        f()
    best = dict.fromkeys(fns, math.inf)
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                f()
            best[k] = min(best[k], (time.perf_counter() - t0) / inner)
    return best


@functools.lru_cache(maxsize=None)
def cpu_costs(d: int = 576, f: int = 1536, v: int = 8192) -> dict[str, float]:
    """Seconds for the probe's products per dtype (remembered per machine: ``_remembered``)."""
    return _remembered(f"cpu_costs/{d}x{f}x{v}", lambda: _measure_cpu_costs(d, f, v))


def _measure_cpu_costs(d: int, f: int, v: int) -> dict[str, float]:
    from .models.common import as_t

    g = torch.Generator().manual_seed(0)
    fns = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        ws = [as_t(torch.randn(n, d, generator=g), dt) for n in (f, v)]
        xs = [torch.randn(rows, d, generator=g).to(dt) for rows in (1, 8)]
        fns[name] = lambda ws=ws, xs=xs: [x @ w for x in xs for w in ws]
    return _interleaved(fns, rounds=5, inner=2)


@functools.lru_cache(maxsize=None)
def c_pass_costs(d: int = 576, f: int = 1536, v: int = 8192) -> dict[str, float]:
    """Seconds for the C pass's own products per dtype (remembered per machine: ``_remembered``):
    fp32 (linear.c) against the bf16 compute type's records (bf16_rows.c), what a llama-family
    HF checkpoint runs in either dtype. ``cpu_costs`` measures torch's products, which on an AVX2
    CPU convert bf16 in software: it chose fp32 there although the bf16 C pass streams half the
    bytes (session 34, Zen 3)."""
    return _remembered(f"c_pass_costs/{d}x{f}x{v}", lambda: _measure_c_pass_costs(d, f, v))


def _measure_c_pass_costs(d: int, f: int, v: int, mb: int = 64) -> dict[str, float]:
    """Both dtypes' products over distinct copies of an f x d and a v x d matrix, ~``mb`` MB of
    fp32 weights (more than a desktop CPU's last-level cache, as a decode step's weights are), at
    1 and 8 rows."""
    from .models.common import Linear

    g = torch.Generator().manual_seed(0)
    copies = max(1, mb * 2**20 // ((f + v) * d * 4))
    ws = [torch.randn(n, d, generator=g) for _ in range(copies) for n in (f, v)]
    xs = [torch.randn(rows, d, generator=g) for rows in (1, 8)]
    fns = {}
    for name in ("fp32", "bf16"):
        lins = [Linear(w, torch.float32, native=True) if name == "fp32" else Linear.bf16(w) for w in ws]
        fns[name] = lambda lins=lins: [lin(x) for x in xs for lin in lins]
    return _interleaved(fns, rounds=5, inner=2)


def _llama_config(hf_config: dict):
    """The llama-family configuration of an HF config, or None where it is not one."""
    from .errors import ModelLoadError
    from .models import llama

    try:
        return llama.LlamaConfig.from_hf(hf_config)
    except (ModelLoadError, TypeError, ValueError):
        return None


def bf16_records_take(hf_config: dict) -> bool:
    """Whether the llama-family model of this HF config would run the bf16 compute type's C pass
    (``llama.bf16_fits``: bf16 records in bf16_rows.c), not torch's bf16 pass."""
    from .models import llama

    c = _llama_config(hf_config)
    return c is not None and llama.bf16_fits(c)


def native_fp32_pass() -> bool:
    """Whether an fp32 llama-family model would run its passes in engine/native/llama_rows.c (the
    library builds, the C pass and linear.c are on)."""
    from . import native
    from .models.common import native_linear

    return native.lib() is not None and native.rows_enabled() and bool(native_linear())


def auto_dtype(device: str | torch.device = "cpu", model_type: str | None = None, hf_config: dict | None = None) -> str:
    """"bf16" or "fp32" for ``device``: bf16 on CUDA; on CPU fp32 for a llama-family model the C
    pass takes (its GGUF blocks kept: on an AVX-512 BF16 EPYC, where the product probe favours
    bf16 1.8x, SmolLM2's fp32 C-pass decode step took 6.6-7.2 ms against the bf16 torch pass's
    22.8-22.9, `bench/decode_step.py --last 1`, 2026-11-24) unless ``hf_config`` (the config of an
    HF-format checkpoint: full-width weights) says its bf16 passes run in C (``bf16_c_pass``: there
    the fp32 C pass streams twice the bytes, 31-35 ms a step against the glue's 17-20 ms and the bf16
    C pass's ~9.6, 2026-11-27); otherwise bf16 when the probe finds it at least 10% faster: the C
    pass's products (``c_pass_costs``) where the bf16 C pass takes the model, else torch's."""
    if torch.device(device).type == "cuda":
        return "bf16"
    if model_type is not None:
        from .models.llama import MODEL_TYPES

        if model_type in MODEL_TYPES and native_fp32_pass():
            if not (hf_config is not None and bf16_c_pass(hf_config)):
                return "fp32"
            if bf16_records_take(hf_config):  # both dtypes' passes in C: their own products decide
                c = c_pass_costs()
                return "bf16" if c["bf16"] < 0.9 * c["fp32"] else "fp32"
    c = cpu_costs()
    return "bf16" if c["bf16"] < 0.9 * c["fp32"] else "fp32"


def bf16_c_pass(hf_config: dict) -> bool:
    """Whether bf16 passes of the llama-family model of this HF config would run in C: the bf16
    compute type's C pass (``llama.bf16_fits``: AVX2 + FMA or better, shapes it takes) or the torch pass
    with engine/native/glue_bf16.c between its products (the kernels load, nothing switches them
    off, the shapes fit)."""
    from .models import llama

    c = _llama_config(hf_config)
    return c is not None and (llama.bf16_fits(c) or (llama.glue_lib() is not None and llama.glue_fits(c)))


def slow_bf16_note(dtype: str | None, device: str | torch.device = "cpu", model=None) -> str | None:
    """A one-line note when ``--dtype bf16`` was asked for on a CPU whose bf16 products the probe
    measures at 1.5x+ the fp32 ones (no native bf16: AVX2 converts in software; a batched bf16
    forward ran 8x slower than fp32 on a 2-core AVX2 EPYC, 2026-11-25); None otherwise. ``model``
    (loaded): where it runs the bf16 C pass (bf16 records inside an fp32 pass), the C pass's own
    products are what compare (``c_pass_costs``: on AVX2 bf16 records are the faster ones)."""
    if dtype != "bf16" or torch.device(device).type != "cpu":
        return None
    in_c = model is not None and getattr(model, "compute_dtype", None) == torch.bfloat16 and getattr(model, "dtype", None) == torch.float32
    c = c_pass_costs() if in_c else cpu_costs()
    ratio = c["bf16"] / max(c["fp32"], 1e-12)
    if ratio < 1.5:
        return None
    return f"note: bf16 products run {ratio:.1f}x slower than fp32 on this CPU (no native bf16); --dtype fp32 is faster here"


def packed_rows(dtype: torch.dtype) -> int:
    """Rows a oneDNN packed product of 1-3 rows should run as in ``dtype``: 4 where the probe
    (remembered per machine) finds a 4-row pass over weights streamed from memory at least 5%
    faster than a 2-row one, else 2 (the least the row-independent path takes)."""
    name = str(dtype).replace("torch.", "")
    c = _remembered(f"packed_rows/{name}", lambda: _measure_packed_rows(dtype))
    return 4 if c["4"] < 0.95 * c["2"] else 2


def _measure_packed_rows(dtype: torch.dtype, mb: int = 96) -> dict[str, float]:
    """Seconds for a pass of 2 and of 4 rows over ~``mb`` MB of packed 576 x 3072 weights (more
    than a server CPU's last-level cache: a decode step streams its weights from memory)."""
    from .models.common import Linear

    g = torch.Generator().manual_seed(0)
    w = torch.randn(3072, 576, generator=g)
    n = max(2, mb * 2**20 // (w.numel() * torch.empty((), dtype=dtype).element_size()))
    ws = [Linear(w + i, dtype, pack=True, native=False) for i in range(n)]  # distinct copies: nothing shared in cache
    xs = {r: torch.randn(r, 576, generator=g).to(dtype) for r in (2, 4)}
    op = torch.ops.mkldnn._linear_pointwise
    fns = {str(r): lambda x=x: [op(x, lin._packed, None, "none", [], "") for lin in ws] for r, x in xs.items()}
    return _interleaved(fns, rounds=5, inner=2)


@functools.lru_cache(maxsize=None)
def q8_costs(K: int = 576, N: int = 1536) -> dict[str, float]:
    """Seconds for a Q4_1 product at 1 and 8 rows, fp32 activations vs the q8 compute type's 8-bit
    ones (engine/native/quant_a8.c), remembered per machine (``_remembered``)."""
    return _remembered(f"q8_costs/{K}x{N}", lambda: _measure_q8_costs(K, N))


def _measure_q8_costs(K: int, N: int) -> dict[str, float]:
    from .models.common import Linear
    from .models.quant import pack, quantize_rows

    g = torch.Generator().manual_seed(0)
    raw = quantize_rows(torch.randn(N, K, generator=g) * 0.05, "Q4_1")
    xs = [torch.randn(rows, K, generator=g) for rows in (1, 8)]
    fns = {}
    for name, qt in (("fp32", "Q4_1"), ("q8", "Q4_1a8")):
        lin = Linear.quantized(pack(raw, qt, K), qt, K, N)
        fns[name] = lambda lin=lin: [lin(x) for x in xs]
    return _interleaved(fns, rounds=9, inner=8)


def auto_q8(model_type: str | None, qtypes: set[str]) -> bool:
    """--dtype auto picks the q8 compute type for a GGUF llama-family model whose blocks the
    kernels take (Q4_1 / Q8_0) when the fp32 C pass would run it and the probe finds the 8-bit
    products at least 20% faster (AVX-512 VNNI, or AVX2's maddubs; a CPU with neither runs a
    scalar loop and loses).
    SPECCHAT_AUTO_Q8=0 keeps fp32."""
    import os

    from . import native
    from .models import quant

    if os.environ.get("SPECCHAT_AUTO_Q8", "1").strip().lower() in ("0", "off", "false", "no"):
        return False
    if not qtypes or not qtypes <= {"Q4_1", "Q8_0"} or not quant.enabled():
        return False
    if auto_dtype(model_type=model_type) != "fp32" or not native_fp32_pass() or native.lib() is None:
        return False
    return q8_faster()


def q8_faster() -> bool:
    """The probe's verdict: the 8-bit-activation products at least 20% faster here."""
    from . import native

    if native.lib() is None:
        return False
    c = q8_costs()
    return c["q8"] < 0.8 * c["fp32"]
