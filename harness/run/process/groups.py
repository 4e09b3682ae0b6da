"""Cell processes: each in its own process group that dies with the harness (even a SIGKILLed one), the groups
of the cells running now (so an interrupted harness kills every one), and the per-cell log, capped at its tail."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from kvmatrix.harness.cell.process_group import die_with_parent, killpg  # noqa: F401  (this module's interface too)
from kvmatrix.harness.run.host.gpu_memory import GpuBaseline

LOG_CAP_BYTES = 2 * 1024 * 1024


def cap_log(path: Path, cap: int = LOG_CAP_BYTES) -> None:
    """Keep a log's tail (where the error is) when a cell printed more than `cap` bytes."""
    size = path.stat().st_size if path.exists() else 0
    if size <= cap:
        return
    with path.open("rb") as f:
        f.seek(size - cap)
        tail = f.read()
    path.write_bytes(f"[kvmatrix: log capped, first {size - cap} bytes dropped]\n".encode() + tail)


class CellProcesses:
    """The process groups of running cells (with the GPU each is pinned to), so that an interrupted harness kills
    every one of them and the GPU check knows which processes belong to cells still running; and the GPUs'
    baselines that check compares with (none: no check)."""

    def __init__(self, gpu_baselines: dict[int, GpuBaseline] | None = None, run_mark: str = "") -> None:
        self._pgids: dict[int, int | None] = {}
        self.run_mark = run_mark  # the run folder its cells' RUN_MARK_ENV names
        self._lock = threading.Lock()
        self.stopping = False
        self.gpu_baselines = gpu_baselines or {}

    def add(self, pgid: int, gpu: int | None = None) -> None:
        with self._lock:
            self._pgids[pgid] = gpu
            if self.stopping:  # started while the harness was being stopped
                killpg(pgid)

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._pgids.pop(pgid, None)

    def running(self) -> dict[int, int | None]:
        """pgid → GPU index of every cell running now."""
        with self._lock:
            return dict(self._pgids)

    def keep_leak(self, gpu: int, pids: set[int], mib: float) -> None:
        """A reported leak becomes part of its GPU's baseline: the cells after the one that leaked are not blamed."""
        with self._lock:
            before = self.gpu_baselines[gpu]
            self.gpu_baselines[gpu] = GpuBaseline(before.used_mib + mib, before.pids | pids)

    def kill_all(self) -> None:
        """The harness is stopping: cells it kills now are not recorded, so a rerun runs them again."""
        self.stopping = True
        with self._lock:
            for pgid in list(self._pgids):
                killpg(pgid)


# Set in every cell's environment (harness/run/process/env.py) to its run folder: a process that carries another
# value, or none, is not this run's, even where it left its cell's process group (an escaped grandchild keeps it).
RUN_MARK_ENV = "KVMATRIX_RUN"


def run_mark_of(pid: int) -> str | None:
    """The run folder a process's environment names ("" for none); None where its environment cannot be read
    (gone, or another user's)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = f"{RUN_MARK_ENV}=".encode()
    return next((item[len(prefix):].decode(errors="replace") for item in environ.split(b"\0")
                 if item.startswith(prefix)), "")


def pgid_of(pid: int) -> int | None:
    """The process group of a pid; None for one that is gone or not visible here."""
    try:
        return os.getpgid(pid)
    except OSError:
        return None
