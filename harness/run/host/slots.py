"""How many cells this machine runs at once, and what each slot sees: the class's `slots_per_device` packing,
capped by the GPU's memory and the host's cores; each slot gets its share of the cores (torch's and vLLM's CPU
threads), so packed engines do not fight over the same cores. A slot is pinned to one GPU (CUDA_VISIBLE_DEVICES,
in NVML's PCI order) or, on a CPU class with several slots, to its own cores."""

from __future__ import annotations

import os
from dataclasses import dataclass

from kvmatrix.harness.vllm_compat import CPU_THREADS_BIND_ENV
from kvmatrix.matrix.schema import GpuClass

# Cores one slot needs, by device. A running GPU cell kept 1.42 cores busy on average (its CPU seconds over its
# wall seconds, FlashInfer's nvcc builds included) in the H200's cold vLLM 0.34.0 run, 1.2-1.6 in the 0.33.0 runs
# (benchmarks/h200_scaling.py): 16 cores hold eleven before the CPU is the bound; that run's eight slots kept the
# host only half busy (6505 CPU-s in 811 s). A CPU cell with a tiny model spends its time in single-threaded Python
# (imports, engine start, probes): two one-core slots ran the 2-core CPU matrix in 201 s against 314 s for one
# two-core slot, every record equal (benchmarks/README.md).
MIN_CORES_PER_SLOT = {"cuda": 1.45, "cpu": 1}
# What one packed cell may hold of a GPU (CUDA context, a tiny model, the class's 1 GiB KV cache, activations
# and compile workspaces, and what its slot's warm workers keep between cells) with room to spare: the busiest
# moment of the H200's cold vLLM 0.34.0 run (8 slots, tests/fixtures/runs/h200-vllm-0.34.0-2026-12-04.tar.xz) held
# 47.7 GiB on the card, 6 GiB a slot. An 80 GiB card packs up to nine, a 141 GiB card seventeen, a 24 GiB card two.
GPU_GIB_PER_SLOT = 8


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on, in order: all of the machine's, or fewer under `taskset` or a container's
    cpuset, which every process the run starts inherits (vLLM's CPU worker binds within them too)."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def core_list(cores: tuple[int, ...], share: int, index: int) -> str:
    """The `index`-th share of `cores` (more shares than cores share them round), as VLLM_CPU_OMP_THREADS_BIND
    lists cores: `4-7` for a run of them, else `2,5`."""
    mine = [cores[(index * share + k) % len(cores)] for k in range(share)]
    if mine == list(range(mine[0], mine[-1] + 1)):
        return f"{mine[0]}-{mine[-1]}"
    return ",".join(map(str, mine))


def slot_count(host: GpuClass, devices: int, cores: int, device_memory_gib: float | None = None) -> int:
    """Cells at once: the class's packing on every GPU (one slot group on a CPU), within memory and cores."""
    per_device = host.slots_per_device
    if host.device == "cuda" and device_memory_gib:
        per_device = min(per_device, max(1, int(device_memory_gib // GPU_GIB_PER_SLOT)))
    wanted = per_device * (max(1, devices) if host.device == "cuda" else 1)
    return max(1, min(wanted, int(cores // MIN_CORES_PER_SLOT[host.device])))


def slot_env(host: GpuClass, slot: int, slots: int, devices: int, cores: tuple[int, ...]) -> dict[str, str]:
    """Slot `slot` of `slots`: its GPU and its share of the `cores`."""
    share = max(1, len(cores) // slots)
    env = {"OMP_NUM_THREADS": str(share)}
    if host.device == "cuda":
        per_device = max(1, -(-slots // max(1, devices)))
        # PCI bus order: CUDA's default (fastest first) could name another card than NVML's index on a host
        # with mixed GPUs, and the GPU-memory check reads NVML by the pinned index.
        env.update({"CUDA_VISIBLE_DEVICES": str(slot // per_device % max(1, devices)),
                    "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    elif slots > 1:
        # vLLM's CPU worker binds its OpenMP threads to the cores it is given; by default every engine takes
        # them all.
        env[CPU_THREADS_BIND_ENV] = core_list(cores, share, slot)
    return env


def ranks_env(host: GpuClass, devices: list[int], cores: tuple[int, ...]) -> dict[str, str]:
    """What a cell spanning several devices sees: all of its GPUs, or on a CPU host one share of the cores per rank
    (vLLM's CPU workers bind rank i's threads to the i-th `|`-separated list; with one NUMA node it cannot choose
    them itself)."""
    share = max(1, len(cores) // len(devices))
    if host.device == "cuda":
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "OMP_NUM_THREADS": str(share)}
    return {"OMP_NUM_THREADS": str(share),
            CPU_THREADS_BIND_ENV: "|".join(core_list(cores, share, d) for d in devices)}


@dataclass(frozen=True)
class Slots:
    """A run's slots on this machine: `count` cells at once on `host`'s `devices` GPUs (0 on a CPU class) and the
    `cores` the run may use (`usable_cores`)."""

    count: int
    host: GpuClass
    devices: int
    cores: tuple[int, ...]

    def env(self, slot: int) -> dict[str, str]:
        """Each slot's cells see one GPU (engines on different GPUs never meet) and their share of the cores (of
        `count` slots: a run of fewer shares the cores among fewer)."""
        return slot_env(self.host, slot, self.count, self.devices, self.cores)

    def ranks_env(self, devices: list[int]) -> dict[str, str]:
        """A cell spanning several devices sees them all, and nothing else runs on them meanwhile."""
        return ranks_env(self.host, devices, self.cores)
