"""The GPU pool at run time: which class this machine is, and whether a requested class may run here.

A class runs natively when the machine is that class; another CUDA class may be emulated on a real GPU (vLLM's
decisions follow the emulated compute capability, kernels still run on the real card), only when asked.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from matrix.schema import GpuClass


class PoolError(RuntimeError):
    pass


@dataclass(frozen=True)
class LocalDevice:
    name: str  # the driver's name, e.g. "NVIDIA H200"; "cpu" without a GPU
    capability: str | None  # "9.0"
    count: int


def detect_device() -> LocalDevice:
    """Ask torch (the driver) what this machine has. Imported lazily: torch is slow to import."""
    try:
        import torch
    except ImportError:
        return LocalDevice("cpu", None, 0)
    if not torch.cuda.is_available():
        return LocalDevice("cpu", None, 0)
    major, minor = torch.cuda.get_device_capability(0)
    return LocalDevice(torch.cuda.get_device_name(0), f"{major}.{minor}", torch.cuda.device_count())


def class_of(device: LocalDevice, pool: dict[str, GpuClass]) -> str | None:
    """The pool class this device is: `cpu`, or the class whose name globs match the driver's name."""
    if device.capability is None:
        return next((n for n, g in pool.items() if g.device == "cpu"), None)
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
            raise PoolError(f"this machine's GPU {device.name!r} (SM {device.capability}) is in no class of the "
                            f"pool; add it to cases/_pool.yaml or name a class with GPU=<class> --emulate")
        return local, None
    if requested not in pool:
        raise PoolError(f"GPU class {requested!r} is not in the pool; known: {', '.join(pool)}")
    if requested == local:
        return requested, None
    target = pool[requested]
    if not emulate:
        raise PoolError(f"this machine is {local or device.name!r}, not {requested!r}; run on a {requested} or "
                        f"emulate its decisions on a real GPU with EMULATE=1 (--emulate)")
    if device.capability is None or target.device != "cuda":
        raise PoolError(f"cannot emulate {requested!r} on {local or device.name!r}: emulation needs a real CUDA "
                        f"GPU and a CUDA class")
    return requested, local or device.name
