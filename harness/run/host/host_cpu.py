"""How busy the host's CPU was over a run, from Linux's /proc/stat: whether a slow run waited on the CPU (a cold
machine's JIT compiles: on the H200, nvcc building FlashInfer's modules was three quarters of the cold matrix's
CPU time) or on something else. Each record's `timings.cpu_s` says which cells used it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from kvmatrix.harness.record.types import JudgedRecord

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class Reading:
    at: float  # time.monotonic()
    busy_s: float | None  # CPU seconds all cores spent busy since boot; None where /proc/stat is not readable
    cores: int
    wall_clock: float = field(default_factory=time.time)


def reading(stat: Path = PROC_STAT) -> Reading:
    return Reading(time.monotonic(), _busy_seconds(stat), os.cpu_count() or 1)


def _busy_seconds(stat: Path) -> float | None:
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...: idle and iowait are the not-busy ones.
    jiffies = [int(x) for x in fields[1:9]]
    return (sum(jiffies) - jiffies[3] - jiffies[4]) / os.sysconf("SC_CLK_TCK")


def summary(start: Reading, end: Reading, records: Iterable[JudgedRecord]) -> str:
    """One line: the host's busy share between two readings, and the CPU seconds of the cells that finished in
    between (a resumed run's earlier cells are not this host's work now)."""
    wall = end.at - start.at
    cells_cpu_s = sum(((r.get("timings") or {}).get("cpu_s") or 0.0 for r in records
                       if _finished_at(r) >= int(start.wall_clock)), 0.0)  # records stamp whole seconds
    cells = f"the cells' own processes {cells_cpu_s:.0f} CPU-s"
    if start.busy_s is None or end.busy_s is None or wall <= 0:
        return f"host CPU: not readable here; {cells}"
    busy = end.busy_s - start.busy_s
    return (f"host CPU: {100 * busy / (wall * end.cores):.0f}% busy ({busy:.0f} CPU-s on {end.cores} cores in "
            f"{wall:.0f} s); {cells}")


def _finished_at(record: JudgedRecord) -> float:
    stamp = record.get("finished_at")
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else 0.0
