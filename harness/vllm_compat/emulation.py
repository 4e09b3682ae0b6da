"""Emulating another class: a CUDA compute capability reported to vLLM's platform, and the CPU instruction-set
probes vLLM's CPU backend asks (detecting this machine's level, turning higher levels off)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvmatrix.harness.vllm_compat.versions import for_version
from kvmatrix.matrix.schema import X86_CPU_LEVELS

# ---------------------------------------------------------------------------------------------------------------
# Emulating another GPU class: vLLM's decisions follow Platform.get_device_capability (kernels still run on the
# real card). Patch every class of this module that defines it, before vLLM resolves its platform.

CUDA_PLATFORM_MODULE = [("", "vllm.platforms.cuda")]
DEVICE_CAPABILITY_CLASS = [("", ("vllm.platforms.interface", "DeviceCapability"))]


def emulate_device_capability(major: int, minor: int, version: str | None) -> list[str]:
    """Make vLLM's CUDA platform report compute capability (major, minor); returns the patched class names."""
    import importlib

    module = importlib.import_module(for_version(CUDA_PLATFORM_MODULE, version)[0])
    capability = _device_capability(major, minor, version)

    def get_device_capability(cls: Any, device_id: int = 0) -> Any:
        return capability

    patched = []
    for name, obj in vars(module).items():
        # Only classes defined there: the imported base Platform also has the method, and other platforms use it.
        if isinstance(obj, type) and obj.__module__ == module.__name__ and "get_device_capability" in vars(obj):
            # Patching vLLM's class on purpose; mypy knows `obj` only as some class, without this method.
            obj.get_device_capability = classmethod(get_device_capability)  # type: ignore[attr-defined]
            patched.append(name)
    if not patched:
        raise RuntimeError(f"no class with get_device_capability in {module.__name__}")
    return patched


def _device_capability(major: int, minor: int, version: str | None) -> Any:
    """vLLM's own DeviceCapability value for (major, minor)."""
    import importlib

    cap_module, cap_name = for_version(DEVICE_CAPABILITY_CLASS, version)[0]
    return getattr(importlib.import_module(cap_module), cap_name)(major, minor)


@contextmanager
def reported_capability(major: int, minor: int, version: str | None) -> Iterator[None]:
    """While inside, the platform vLLM runs on (whatever it is) reports compute capability (major, minor).
    For reading a class's declarations in one process: some ask the platform rather than take the capability
    as an argument (vLLM 0.26.0's FLASH_ATTN declares fp8 only where FA3 runs, i.e. on the SM90 it is asked
    about), and without this they would answer for the card or CPU the reading runs on."""
    from vllm.platforms import current_platform

    capability = _device_capability(major, minor, version)
    platform = type(current_platform)
    own = vars(platform).get("get_device_capability")
    # Patching vLLM's platform class on purpose (put back below); mypy refuses any assignment to a method.
    platform.get_device_capability = classmethod(  # type: ignore[method-assign, assignment]
        lambda cls, device_id=0: capability)
    try:
        yield
    finally:
        if own is None:
            del platform.get_device_capability
        else:
            platform.get_device_capability = own  # type: ignore[method-assign]  # vLLM's own method, put back


# ---------------------------------------------------------------------------------------------------------------
# The CPU's instruction set: vLLM's CPU backend chooses kernels and backends and refuses dtypes by asking torch at
# the moment it decides: `torch.cpu._is_amx_tile_supported()` picks AMX_MLA over CPU_MLA for MLA models
# (platforms/cpu.py `get_attn_backend_cls`) and AMX kernels for attention; `_is_avx512_supported()` (or AMX) allows
# an FP8 KV cache (v1/attention/backends/cpu_attn.py `_get_attn_isa`); `import_kernels` loads the _C, _C_AVX512 or
# _C_AVX2 build. The pool's CPU classes are named by the best level present; emulating a lower level turns the
# probes of every higher one off in the cell process, so vLLM takes that class's decisions and loads its kernels.

CPU_ISA_PROBES = [("", {
    "avx2": ("_is_avx2_supported",),
    "avx512": ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_vnni_supported"),
    "amx": ("_is_amx_tile_supported", "_is_amx_fp16_supported"),
})]
CPU_ISA_PROBE_MODULE = "torch.cpu"


def detect_cpu_isa(machine: str, version: str | None) -> str | None:
    """This machine's CPU class level as vLLM sees it ("amx", "avx512", "avx2", "neon"), None for an x86 CPU below
    AVX2."""
    if machine.lower().startswith(("arm", "aarch")):
        return "neon"
    import importlib

    module = importlib.import_module(CPU_ISA_PROBE_MODULE)
    probes = for_version(CPU_ISA_PROBES, version)[0]
    found = [level for level in X86_CPU_LEVELS
             if any(getattr(module, name, lambda: False)() for name in probes[level])]
    return found[-1] if found else None


def emulate_cpu_isa(level: str, version: str | None) -> list[str]:
    """Make vLLM see an x86 CPU whose best level is `level`: every probe of a higher level answers False.
    Returns the patched probe names. Before vLLM's first decision (the cell does it before `import vllm`)."""
    import importlib

    module = importlib.import_module(CPU_ISA_PROBE_MODULE)
    probes = for_version(CPU_ISA_PROBES, version)[0]
    higher = X86_CPU_LEVELS[X86_CPU_LEVELS.index(level) + 1:]
    patched = [name for above in higher for name in probes[above] if hasattr(module, name)]
    for name in patched:
        setattr(module, name, lambda: False)
    return patched
