"""After each cell: is its GPU back at the run's starting baseline? A process still holding memory there that
was not there before, belongs to no running cell and to no other run (harness/run/process/groups.py: RUN_MARK_ENV),
or (when no other cell runs on that GPU) memory more than the tolerance above the baseline, is the cell's `leak`.
Reported, never killed."""

from __future__ import annotations

import time
from collections.abc import Callable

from kvmatrix.harness.record.types import OutcomeRecord
from kvmatrix.harness.run.host.gpu_memory import GpuMemory, physical_index
from kvmatrix.harness.run.process.groups import CellProcesses, pgid_of, run_mark_of

# Above its baseline by more than this, a GPU no cell runs on holds memory a cell left behind (the driver's and
# allocator's own usage wobbles a little between runs).
GPU_LEAK_TOLERANCE_MIB = 256
GPU_POLL_S = 0.5


def pinned_gpus(slot_env: Callable[[int], dict[str, str]] | None, jobs: int) -> set[int]:
    """The GPUs the slots are pinned to (plain indices; other pins are not checked)."""
    if slot_env is None:
        return set()
    pins = (physical_index(slot_env(slot).get("CUDA_VISIBLE_DEVICES")) for slot in range(max(1, jobs)))
    return {index for index in pins if index is not None}


def check_gpu_memory(memory: GpuMemory, gpu: int, processes: CellProcesses, settle_s: float) -> OutcomeRecord:
    """After a cell's process group is gone: wait (up to `settle_s`, returning as soon as it is) until its GPU
    is back at its baseline; the record's `gpu_memory`, and a `leak` line if it is not back.
    Processes of cells still running there are theirs, and while any runs the GPU's total is theirs too, so then
    only processes are checked (`exclusive` False)."""
    baseline = processes.gpu_baselines[gpu]
    started = time.monotonic()
    while True:
        running = processes.running()
        held = {pid: mib for pid, mib in memory.processes(gpu).items() if pid not in baseline.pids}
        # A process whose environment names another run, or none, is another program's (a second harness run
        # sharing the GPU: seen on the H200, its workers were blamed as this run's leaks); while one holds memory,
        # the GPU's total is not this run's to compare either.
        others = {pid for pid in held if run_mark_of(pid) not in (None, processes.run_mark)}
        exclusive = gpu not in running.values() and not others
        foreign = {pid: mib for pid, mib in held.items() if pid not in others and pgid_of(pid) not in running}
        used = memory.used_mib(gpu)
        above = used - baseline.used_mib if exclusive else 0.0
        driver_level = not foreign and above > GPU_LEAK_TOLERANCE_MIB
        if not (foreign or driver_level) or time.monotonic() - started >= settle_s:
            break
        time.sleep(GPU_POLL_S)
    leaked = sum(foreign.values()) if foreign else (above if driver_level else 0.0)
    out: OutcomeRecord = {"gpu_memory": {
        "gpu_index": gpu, "baseline_mib": round(baseline.used_mib, 1), "after_mib": round(used, 1),
        "leaked_mib": round(leaked, 1), "leaked_pids": {str(pid): round(mib, 1) for pid, mib in foreign.items()},
        "exclusive": exclusive, "waited_s": round(time.monotonic() - started, 3),
    }}
    # Reported, never killed: a process the harness did not start may be an operator's (a notebook, a server).
    if foreign or driver_level:
        processes.keep_leak(gpu, set(foreign), leaked)
    if foreign:
        holders = "1 process still holds" if len(foreign) == 1 else f"{len(foreign)} processes still hold"
        pids = ", ".join(str(pid) for pid in sorted(foreign))
        out["leak"] = f"{holders} {leaked:.0f} MiB on GPU {gpu} after the cell ended: pids {pids}"
    elif driver_level:
        out["leak"] = (f"GPU {gpu} holds {leaked:.0f} MiB above its baseline after the cell ended, held by no "
                       "listed process (driver-level)")
    return out
