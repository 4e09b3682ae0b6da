"""How much memory a GPU holds and which processes hold it, as NVML sees it: what the runner checks after each
cell to find memory a cell left behind. Reading NVML never initialises CUDA, so the harness can do it."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Protocol

from kvmatrix.harness.vllm_compat import vendored_pynvml

MIB = 1024 * 1024


class GpuMemory(Protocol):
    """The GPUs' memory by physical index (the index a slot pins with CUDA_VISIBLE_DEVICES)."""

    def used_mib(self, index: int) -> float: ...

    def processes(self, index: int) -> dict[int, float]:
        """The compute processes on the GPU: pid → MiB they hold."""
        ...


@dataclass(frozen=True)
class GpuBaseline:
    """A GPU before the run: the memory in use and the processes (not the harness's) that held it."""

    used_mib: float
    pids: frozenset[int]


def gpu_baselines(memory: GpuMemory, indices: set[int]) -> dict[int, GpuBaseline]:
    return {i: GpuBaseline(memory.used_mib(i), frozenset(memory.processes(i))) for i in indices}


class NvmlGpuMemory:
    def __init__(self, nvml) -> None:
        self._nvml = nvml

    def used_mib(self, index: int) -> float:
        handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        return self._nvml.nvmlDeviceGetMemoryInfo(handle).used / MIB

    def processes(self, index: int) -> dict[int, float]:
        handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        held: dict[int, float] = {}
        for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            # usedGpuMemory is None where the driver cannot say (e.g. under MIG or without permission).
            held[proc.pid] = held.get(proc.pid, 0.0) + (proc.usedGpuMemory or 0) / MIB
        return held


def open_gpu_memory() -> GpuMemory | None:
    """NVML's view of this machine's GPUs; None where there is no NVIDIA driver (CPU machines)."""
    try:  # the driver's library first: without it, importing vLLM's copy below would load torch for nothing
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    try:
        import pynvml
    except ImportError:
        pynvml = vendored_pynvml()
        if pynvml is None:
            return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    return NvmlGpuMemory(pynvml)


def physical_index(pin: str | None) -> int | None:
    """The GPU a CUDA_VISIBLE_DEVICES pin names; None for no pin or one that is not a plain index (a list, a
    UUID), which the check leaves alone."""
    return int(pin) if pin is not None and pin.strip().isdigit() else None
