"""Memory readings for the dashboard: process RSS and system RAM (psutil), GPU via nvidia-ml-py.

The GPU part is optional: if ``pynvml`` does not import, ``nvmlInit`` fails or no device is found,
:class:`GpuProbe` is simply unavailable and the dashboard hides its GPU line. Every NVML call is
guarded, so a driver hiccup mid-session hides the line instead of raising in the UI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import psutil

MB = 1024 * 1024


@dataclass
class GpuReading:
    index: int
    name: str
    used_mb: float
    total_mb: float
    util_pct: float | None  # None: not supported by this device


@dataclass
class MemoryReading:
    rss_mb: float
    ram_used_mb: float
    ram_total_mb: float
    gpus: list[GpuReading] = field(default_factory=list)


class GpuSource(Protocol):
    available: bool

    def read(self) -> list[GpuReading]: ...


class GpuProbe:
    """NVIDIA GPUs through nvidia-ml-py (``import pynvml``); ``available`` False without one."""

    def __init__(self) -> None:
        self.available = False
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception:  # noqa: BLE001 - no module, no driver, no device: no GPU line
            return
        self._nvml = pynvml
        self.available = bool(self._handles)

    def read(self) -> list[GpuReading]:
        if not self.available:
            return []
        nvml, out = self._nvml, []
        try:
            for i, handle in enumerate(self._handles):
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                name = nvml.nvmlDeviceGetName(handle)
                name = name.decode() if isinstance(name, bytes) else str(name)
                try:
                    util: float | None = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                except Exception:  # noqa: BLE001 - NVMLError_NotSupported on some devices
                    util = None
                out.append(GpuReading(i, name, mem.used / MB, mem.total / MB, util))
        except Exception:  # noqa: BLE001 - the driver went away: hide the line from now on
            self.available = False
            return []
        return out


class MemoryMonitor:
    """Takes one :class:`MemoryReading` per :meth:`read` (cheap: call it at <= 2 Hz)."""

    def __init__(self, gpu: GpuSource | None = None) -> None:
        self._process = psutil.Process()
        self.gpu: GpuSource = gpu if gpu is not None else GpuProbe()

    def read(self) -> MemoryReading:
        vm = psutil.virtual_memory()
        return MemoryReading(
            rss_mb=self._process.memory_info().rss / MB,
            ram_used_mb=(vm.total - vm.available) / MB,
            ram_total_mb=vm.total / MB,
            gpus=self.gpu.read() if self.gpu.available else [],
        )


def gb(mb: float) -> str:
    return f"{mb / 1024:.1f}"


def memory_lines(reading: MemoryReading, torch_gpu: tuple[float, float] | None = None) -> list[str]:
    """``RSS 512 MiB · RAM 7.9/15.6 GiB (51%)`` (binary units, as measured: MiB = 2**20 bytes), one line per GPU (none without a GPU), and torch's
    CUDA allocator (allocated / peak, from the engine's last StepEvent) when CUDA is in use."""
    pct = 100 * reading.ram_used_mb / reading.ram_total_mb if reading.ram_total_mb else 0.0
    lines = [f"RSS {reading.rss_mb:.0f} MiB · RAM {gb(reading.ram_used_mb)}/{gb(reading.ram_total_mb)} GiB ({pct:.0f}%)"]
    for g in reading.gpus:
        util = f" · util {g.util_pct:.0f}%" if g.util_pct is not None else ""
        lines.append(f"GPU{g.index} {gb(g.used_mb)}/{gb(g.total_mb)} GiB{util} · {g.name}")
    if torch_gpu is not None:
        lines.append(f"torch CUDA allocated {torch_gpu[0]:.0f} MiB · peak {torch_gpu[1]:.0f} MiB")
    return lines
