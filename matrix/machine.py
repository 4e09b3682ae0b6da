"""This machine in the GPU pool: which class it is, and whether a requested class may run here.

A class runs natively when the machine is that class; another class may be emulated, only when asked: a CUDA
class on a real GPU (vLLM's decisions follow the emulated compute capability, kernels still run on the real card),
or a CPU class of a lower instruction-set level on a CPU of the same architecture (vLLM's probes of the higher
levels answer no, so it takes the lower class's decisions and loads its kernel build; a higher level cannot be
emulated: its kernels would not run here).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass

from kvmatrix.matrix.schema import X86_CPU_LEVELS, GpuClass


class PoolError(RuntimeError):
    pass


@dataclass(frozen=True)
class LocalDevice:
    name: str  # the driver's name, e.g. "NVIDIA H200"; "cpu" without a GPU
    capability: str | None  # "9.0"
    count: int
    cpu_arch: str | None = None  # platform.machine(): "x86_64", "aarch64"
    cpu_isa: str | None = None  # the CPU's best level as vLLM sees it: "avx512", "avx2", "neon"
    memory_gib: float | None = None  # each GPU's memory (the first GPU's)


def detect_device(cpu_isa: Callable[[str], str | None]) -> LocalDevice:
    """Ask torch (the driver) what this machine has; `cpu_isa(machine)` reads the CPU's level the way vLLM does.
    Imported lazily: torch is slow to import."""
    import platform

    machine = platform.machine()
    try:
        import torch
    except ImportError:
        return LocalDevice("cpu", None, 0, machine, None)
    if not torch.cuda.is_available():
        return LocalDevice("cpu", None, 0, machine, cpu_isa(machine))
    major, minor = torch.cuda.get_device_capability(0)
    return LocalDevice(torch.cuda.get_device_name(0), f"{major}.{minor}", torch.cuda.device_count(), machine,
                       memory_gib=torch.cuda.get_device_properties(0).total_memory / 2**30)


def class_of(device: LocalDevice, pool: dict[str, GpuClass]) -> str | None:
    """The pool class this device is: the CPU class of its architecture and level, or the CUDA class whose name
    globs match the driver's name."""
    if device.capability is None:
        return next((n for n, g in pool.items()
                     if g.device == "cpu" and (g.cpu_arch, g.cpu_isa) == (device.cpu_arch, device.cpu_isa)), None)
    for name, gpu in pool.items():
        if gpu.device == "cuda" and any(fnmatch.fnmatchcase(device.name, glob) for glob in gpu.names):
            return name
    return None


def resolve(requested: str | None, pool: dict[str, GpuClass], device: LocalDevice,
            emulate: bool = False) -> tuple[str, str | None]:
    """(class to report as, real class when emulating) for `make matrix GPU=<requested>` on this device."""
    local = class_of(device, pool)
    if requested is None:
        if local is None:
            what = (f"GPU {device.name!r} (SM {device.capability})" if device.capability else
                    f"CPU ({device.cpu_arch}, level {device.cpu_isa})")
            raise PoolError(f"this machine's {what} is in no class of the pool; add it to cases/_pool.yaml or name "
                            f"a class with GPU=<class> --emulate")
        return local, None
    if requested not in pool:
        raise PoolError(f"GPU class {requested!r} is not in the pool; known: {', '.join(pool)}")
    if requested == local:
        return requested, None
    target = pool[requested]
    if not emulate:
        raise PoolError(f"this machine is {local or device.name!r}, not {requested!r}; run on a {requested} or "
                        f"emulate its decisions on a real GPU with EMULATE=1 (--emulate)")
    if target.device == "cpu":
        return requested, _cpu_emulation_host(requested, target, device, local)
    if device.capability is None:
        raise PoolError(f"cannot emulate {requested!r} on {local or device.name!r}: emulating a CUDA class needs a "
                        f"real CUDA GPU")
    return requested, local or device.name


def _cpu_emulation_host(requested: str, target: GpuClass, device: LocalDevice, local: str | None) -> str:
    """The real class a CPU class is emulated on: the same architecture at the same or a higher level."""
    levels = X86_CPU_LEVELS
    here = f"{local or device.name!r} ({device.cpu_arch}, level {device.cpu_isa})"
    if device.capability is not None or target.cpu_arch != device.cpu_arch:
        raise PoolError(f"cannot emulate {requested!r} on {here}: a CPU class is emulated on a CPU of its "
                        f"architecture ({target.cpu_arch})")
    if target.cpu_isa not in levels or device.cpu_isa not in levels or (
            levels.index(target.cpu_isa) > levels.index(device.cpu_isa)):
        raise PoolError(f"cannot emulate {requested!r} (level {target.cpu_isa}) on {here}: only a lower x86 level "
                        f"can be emulated; the kernels of a higher one do not run on this CPU")
    return local or device.name
