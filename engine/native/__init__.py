"""Small C kernels for the CPU hot path, compiled on first use with the system C compiler and
loaded with ctypes (no torch headers, no build step at install: ~1 s with gcc, cached).

Why: eager PyTorch pays ~2-5 us per op and CPU bf16 ``bmm`` is slow at decode sizes; the bf16
attention of one layer (exact-order, engine/models/common.blockwise_attention) took ~110 us in
~25 ops for one decode row at 320 keys. ``attn.c`` does the same job per row in one call.

Switches: ``SPECCHAT_NATIVE=0`` turns the kernels off (the torch implementations run instead);
``SPECCHAT_CC`` picks the compiler (default ``cc``). The shared object is cached under
``$XDG_CACHE_HOME/specchat/native`` (default ``~/.cache``) keyed by the source, the compiler and
this CPU's flags. Any failure (no compiler, a read-only cache) falls back to torch, once, with a
one-line reason in ``status()``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False
_reason = "not loaded yet"


_threads_local = threading.local()


def threads() -> int:
    """The threads a kernel call may use: torch's thread count, or fewer inside :func:`capped`."""
    import torch

    n = torch.get_num_threads()
    cap = getattr(_threads_local, "cap", None)
    return n if cap is None else max(1, min(n, cap))


class capped:
    """``with capped(1): ...``: this thread's kernel calls use at most ``n`` threads (None: no cap).

    A drafter's C step beside a target whose passes are torch's (bf16 on a CPU) runs on the
    calling thread alone: torch's OpenMP workers, spinning between passes under
    OMP_WAIT_POLICY=ACTIVE, hold the other core, and the pool's worker waiting for it stalled
    each of the drafter's regions (the shipped drafter's 5-token chain beside bf16 SmolLM2, 2-core
    Zen 4: 22 ms a step in the loop with the pool, 4.5-6.4 ms on one thread; with passive waits
    5.8 vs 5.2 ms)."""

    def __init__(self, n: int | None):
        self.n = n

    def __enter__(self) -> "capped":
        self._prev = getattr(_threads_local, "cap", None)
        _threads_local.cap = self.n
        return self

    def __exit__(self, *exc) -> None:
        _threads_local.cap = self._prev


def _switch_on(name: str, environ=None) -> bool:
    """The environment variable ``name`` (default on) does not say 0 / off / false / no."""
    env = os.environ if environ is None else environ
    return env.get(name, "1").strip().lower() not in ("0", "off", "false", "no")


def enabled(environ=None) -> bool:
    """SPECCHAT_NATIVE (in ``environ``, default the process's) does not turn the kernels off."""
    return _switch_on("SPECCHAT_NATIVE", environ)


def rows_enabled(environ=None) -> bool:
    """llama_rows.c for whole fp32 llama passes (SPECCHAT_NATIVE_ROWS=0: the torch pass over the
    same linear.c products)."""
    return _switch_on("SPECCHAT_NATIVE_ROWS", environ)


def glue_enabled() -> bool:
    """glue_bf16.c between the products of bf16 llama passes (SPECCHAT_NATIVE_GLUE=0: torch's ops)."""
    return _switch_on("SPECCHAT_NATIVE_GLUE")


def _bf16_switches_on(env) -> bool:
    """The kernels, the C pass and the bf16 C pass not switched off in ``env``."""
    return _switch_on("SPECCHAT_NATIVE_BF16", env) and rows_enabled(env) and enabled(env)


def bf16_records_on(environ=None) -> bool:
    """Whether a CPU bf16 llama-family model takes the bf16 compute type's C pass (bf16_rows.c's
    products inside llama_rows.c; ``Llama.keep_bf16``): the kernels load, the C pass is on,
    SPECCHAT_NATIVE_BF16 is not 0, and the products are vectorised (AVX2 + FMA, AVX-512 BF16, or
    AMX-BF16), or SPECCHAT_BF16_PATH=scalar asks for their scalar form (tests, on any CPU).
    Elsewhere bf16 runs through torch (oneDNN products, glue_bf16.c between them). ``environ``: the switches from there
    (default the process's; the kernels' own build reads the process's)."""
    env = os.environ if environ is None else environ
    if not (_bf16_switches_on(env) and lib() is not None):
        return False
    path = bf16_path()
    return path in ("avx2", "avx512", "amx") or (path == "scalar" and env.get("SPECCHAT_BF16_PATH", "").strip() == "scalar")


def bf16_records_likely(environ=None) -> bool:
    """``bf16_records_on`` without loading the kernels (for decisions taken before torch and OpenMP
    load): the same switches, and the CPU's own flags for a vector path (avx512_bf16, or avx2 and
    fma)."""
    env = os.environ if environ is None else environ
    if not _bf16_switches_on(env):
        return False
    flags = cpu_flags()
    return "avx512_bf16" in flags or {"avx2", "fma"} <= flags or env.get("SPECCHAT_BF16_PATH", "").strip() == "scalar"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo's first ``flags`` line; empty where there is none)."""
    return set(_cpu_key().split())


def _cpu_key() -> str:
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    return flags or platform.processor() or platform.machine()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specchat" / "native"


SOURCES = ("attn.c", "bf16_rows.c", "glue_bf16.c", "linear.c", "llama_rows.c", "mamba2_step.c", "pool.c", "quant_a8.c", "select.c")


def _build(srcs: list[Path], cc: str) -> Path:
    flags = ["-O3", "-march=native", "-shared", "-fPIC", "-std=c11", "-fopenmp"]
    headers = sorted({h for s in srcs for h in s.parent.glob("*.h")})  # included by the sources
    key = hashlib.sha256(b"".join(s.read_bytes() for s in [*srcs, *headers]) + cc.encode() + " ".join(flags).encode()
                         + _cpu_key().encode()).hexdigest()[:16]
    out_dir = _cache_dir()
    so = out_dir / f"specchat-{key}.so"
    if so.exists():
        return so
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        r = subprocess.run([cc, *flags, "-o", tmp, *map(str, srcs), "-lm"], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"{cc} failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
        os.replace(tmp, so)  # atomic: concurrent builders each write their own temp file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return so


def _load() -> ctypes.CDLL | None:
    global _lib, _tried, _reason
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if not enabled():
            _reason = "off (SPECCHAT_NATIVE=0)"
            return None
        cc = os.environ.get("SPECCHAT_CC", "cc")
        if shutil.which(cc) is None:
            _reason = f"off: no C compiler ({cc!r} not found)"
            return None
        try:
            lib = ctypes.CDLL(str(_build([_HERE / s for s in SOURCES], cc)))
        except Exception as e:  # noqa: BLE001 - any build/load failure means: use torch
            _reason = f"off: {type(e).__name__}: {e}"
            return None
        p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
        lib.attn_rows_bf16.argtypes = [p, i64, i64, p, p, i64, i32, i32, i32, p, p, p, i32, f32, p, i32, i32]
        lib.attn_rows_bf16.restype = ctypes.c_int
        lib.bf16_add_rmsnorm.argtypes = [p, i64, p, i64, i64, i64, p, f32, p, i64]
        lib.bf16_add_rmsnorm.restype = ctypes.c_int
        lib.bf16_silu_mul.argtypes = [p, i64, i64, i64, p, i64]
        lib.bf16_silu_mul.restype = ctypes.c_int
        lib.bf16_rope_kv.argtypes = [p, i64, i64, i32, i32, i32, i32, p, p, i64, p, p, i64, i64]
        lib.bf16_rope_kv.restype = ctypes.c_int
        lib.linear_rows_f32.argtypes = [p, i64, i64, i64, p, i64, p, p, i32]
        lib.linear_rows_f32.restype = ctypes.c_int
        lib.linear_rows_q.argtypes = [p, i64, i64, i64, p, i32, i64, p, p, i32]
        lib.linear_rows_q.restype = ctypes.c_int
        lib.linear_rows_bf16.argtypes = [p, i64, i64, i64, p, i64, p, p, i32]
        lib.linear_rows_bf16.restype = ctypes.c_int
        lib.bf16_rows_path.argtypes = []
        lib.bf16_rows_path.restype = ctypes.c_int
        lib.a8_vectorized.argtypes = []
        lib.a8_vectorized.restype = ctypes.c_int
        lib.a8_pack.argtypes = [i32, p, i64, i64, p]
        lib.a8_pack.restype = ctypes.c_int
        lib.q8_0_quantize.argtypes = [p, i64, i64, p, p]
        lib.q8_0_quantize.restype = ctypes.c_int
        lib.quant_rows_f32.argtypes = [p, i32, i64, i64, p, i64, p]
        lib.quant_rows_f32.restype = ctypes.c_int
        lib.llama_rows_f32.argtypes = [p, i64, i64, i64, i64, i64, i64, i64, p, i64, p, p, i64, i64, p, p, p, i64, f32, f32, i32, i32]
        lib.llama_rows_f32.restype = ctypes.c_int
        lib.llama_rows_grouped.argtypes = [i64, i64]
        lib.llama_rows_grouped.restype = ctypes.c_int
        lib.llama_rows_kv16_ok.argtypes = [i64]
        lib.llama_rows_kv16_ok.restype = ctypes.c_int
        lib.llama_rows_amx_attention.argtypes = [i64]
        lib.llama_rows_amx_attention.restype = ctypes.c_int
        lib.mamba2_layers_f32.argtypes = [p, i64, i64, i64, p, i64, f32, p, p, i64, i64, i64, i64, i64, f32, f32, f32, i32]
        lib.mamba2_layers_f32.restype = ctypes.c_int
        lib.mamba2_draft_step.argtypes = [p, p, p, p, i64, i64, i32, p, p, p, i32]
        lib.mamba2_draft_step.restype = ctypes.c_int
        lib.topk_values_f32.argtypes = [p, i64, i64, i64, i64, p]
        lib.topk_values_f32.restype = ctypes.c_int
        _lib = lib
        _reason = "on"
        return lib


def lib() -> ctypes.CDLL | None:
    """The loaded kernels, or None (then use torch)."""
    return _lib if _tried else _load()


def a8_path() -> str:
    """Which kernel runs the q8 compute type's products here (quant_a8.c): "amx" (AMX-INT8 tiles
    for passes of 10 rows or more, AVX-512 VNNI below), "vnni" (AVX-512 VNNI), "avx2", "scalar", or
    "off" without the library."""
    lb = lib()
    return "off" if lb is None else ("scalar", "avx2", "vnni", "amx")[lb.a8_vectorized()]


def status() -> str:
    """'on', or why the kernels are off."""
    lib()
    return _reason


def reset_for_tests() -> None:
    global _lib, _tried, _reason
    with _lock:
        _lib, _tried, _reason = None, False, "not loaded yet"


def bf16_path() -> str:
    """Which kernel runs the CPU bf16 compute type's products (bf16_rows.c): "amx" (AMX-BF16's tile
    products, where the CPU has them and Linux grants the tile state), "avx512" (AVX-512 BF16's
    vdpbf16ps), "avx2" (vdpbf16ps's scalar form in AVX2 FMAs, the same bits), "scalar" (that form
    one lane at a time: slow, for tests and CPUs without AVX2), or "off" without the library.
    SPECCHAT_BF16_PATH=amx / avx512 / avx2 / scalar asks for one."""
    lb = lib()
    return "off" if lb is None else ("scalar", "avx2", "avx512", "amx")[lb.bf16_rows_path()]


def attention_path(head_dim: int) -> str:
    """Which kernel runs the C pass's attention over a bf16 KV cache (the bf16 and q8 compute
    types): "amx" (llama_rows.c's attend_group_amx: AMX-BF16 tiles, bf16-rounded queries and
    weights; where the products run on AMX, head size % 32 == 0 and <= 128, SPECCHAT_AMX_ATTN not
    0), "vector" (attend_group's fp32 FMA chains), or "off" without the library."""
    lb = lib()
    return "off" if lb is None else ("amx" if lb.llama_rows_amx_attention(int(head_dim)) else "vector")
