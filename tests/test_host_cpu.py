"""The run's host-CPU line, on what a cold H200 run measured (tests/fixtures/runs/README.md: the cold9 run's
/proc/stat samples every 2 s and its records' `timings.cpu_s`, vLLM 0.26.0)."""

from __future__ import annotations

import json
import tarfile
from datetime import datetime, timezone

from kvmatrix.harness.run.host import host_cpu
from tests.conftest import FIXTURES

CPU_ACCOUNTING_RUNS = FIXTURES / "runs" / "h200-cold-cpu-accounting-vllm-0.26.0-2026-12-01.tar.xz"


def _reading(sample: str, tmp_path, cores: int = 16) -> host_cpu.Reading:
    """A sampled line ("<epoch seconds> cpu <jiffies>...") as the reading /proc/stat gave at that moment."""
    stamp, stat_line = sample.split(" ", 1)
    stat = tmp_path / f"stat-{stamp}"
    stat.write_text(stat_line + "\ncpu0 1 2 3 4\n")
    real = host_cpu.reading(stat)
    return host_cpu.Reading(at=float(stamp), busy_s=real.busy_s, cores=cores, wall_clock=float(stamp))


def test_the_line_sets_the_hosts_busy_time_against_the_cells_own(tmp_path):
    with tarfile.open(CPU_ACCOUNTING_RUNS) as archive:
        archive.extractall(tmp_path, filter="data")
    samples = (tmp_path / "cpu-cold9.txt").read_text().splitlines()
    records = [json.loads(p.read_text()) for p in (tmp_path / "cold9-h200").glob("*--*.json")]
    ended = max(datetime.fromisoformat(r["finished_at"].replace("Z", "+00:00")).timestamp()
                for r in records if r.get("finished_at"))
    start, end = _reading(samples[0], tmp_path), _reading(samples[-1], tmp_path)
    assert end.at >= ended, "the samples cover the whole run"

    line = host_cpu.summary(start, end, records)
    busy = end.busy_s - start.busy_s
    cells = sum(r["timings"].get("cpu_s", 0.0) for r in records if r.get("timings"))
    assert 0 < cells < busy, "the cells' processes are part of the host's work"
    assert line == (f"host CPU: {100 * busy / (16 * (end.at - start.at)):.0f}% busy ({busy:.0f} CPU-s on 16 cores "
                    f"in {end.at - start.at:.0f} s); the cells' own processes {cells:.0f} CPU-s")

    later = _reading(samples[len(samples) // 2], tmp_path)
    middle = datetime.fromtimestamp(later.wall_clock, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    finished_before = [r for r in records if r.get("finished_at") and r["finished_at"] < middle]
    assert finished_before, "the middle sample falls inside the run"
    counted = host_cpu.summary(later, end, records).rsplit(" ", 2)[-2]
    assert float(counted) < cells, "cells finished before the first reading (a resumed run's) are not counted"


def test_without_proc_stat_the_line_says_so(tmp_path):
    missing = host_cpu.reading(tmp_path / "no-proc-stat")
    assert missing.busy_s is None
    assert host_cpu.summary(missing, host_cpu.reading(tmp_path / "no-proc-stat"), []) == (
        "host CPU: not readable here; the cells' own processes 0 CPU-s")
