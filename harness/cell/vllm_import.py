"""vLLM imported into a cell's process under the cell's emulation, once per process: a warm worker's later cells
and the cells a template forks find it imported (harness/cell/template_server.py imports it ahead of them)."""

from __future__ import annotations

from typing import Any

from kvmatrix.harness import vllm_compat
from kvmatrix.harness.record.types import CellOutput, Emulation

# What a cell emulates, as the runner gives a warm worker cells of one only: (the CUDA capability, the CPU level).
EmulationKey = tuple[tuple[int, ...], str | None]
# This process's vLLM once imported (a warm worker's, or a template's that forked this process): (the emulation
# it was imported under, vllm, the emulation record).
_imported: tuple[EmulationKey, Any, Emulation | None] | None = None


def import_vllm(data: CellOutput, capability: list[int] | None, cpu_isa: str | None) -> Any:
    """vLLM, imported under the spec's emulation; in a warm worker (or a process forked from a template) the cell
    finds it already imported (the runner gives such a process only cells of one emulation, so a different one is
    the runner's bug)."""
    key: EmulationKey = (tuple(capability or ()), cpu_isa)
    if _imported is None:
        # Recorded before the import: a cell whose import fails still says what it emulated.
        data["emulation"] = _emulate(capability, cpu_isa, data["vllm_version"])
        _import_under(key, data["emulation"])
    assert _imported is not None, "set by _import_under"
    imported_key, vllm, emulation = _imported
    if imported_key != key:
        raise RuntimeError(f"this worker imported vLLM under emulation {imported_key}, not {key}")
    data["emulation"] = emulation
    return _versions(data, vllm)


def preimport_vllm(capability: list[int] | None, cpu_isa: str | None, version: str | None) -> None:
    """torch and vLLM imported under an emulation, as `import_vllm` imports them, for this process's later cells
    (a template's, harness/cell/template_server.py)."""
    _import_under((tuple(capability or ()), cpu_isa), _emulate(capability, cpu_isa, version))


def _emulate(capability: list[int] | None, cpu_isa: str | None, version: str | None) -> Emulation | None:
    """vLLM's probes patched for the emulated class (before its import); what was patched, None for no emulation."""
    emulation: Emulation | None = None
    if capability is not None:
        # Before LLM(): vLLM reads the capability while it picks backends and checks dtypes.
        major, minor = capability
        patched = vllm_compat.emulate_device_capability(major, minor, version)
        emulation = {"capability": list(capability), "patched_classes": patched}
    if cpu_isa is not None:
        # Before `import vllm`: its CPU platform picks a kernel build at import.
        patched = vllm_compat.emulate_cpu_isa(cpu_isa, version)
        emulation = {"cpu_isa": cpu_isa, "patched_probes": patched}
    return emulation


def _import_under(key: EmulationKey, emulation: Emulation | None) -> None:
    global _imported
    import torch  # noqa: F401  torch before vLLM, as ever: vLLM's import-time checks see torch as the cell set it
    import vllm

    _imported = (key, vllm, emulation)


def _versions(data: CellOutput, vllm: Any) -> Any:
    import torch

    data["vllm_version"] = vllm.__version__
    data["torch_version"] = torch.__version__
    return vllm
