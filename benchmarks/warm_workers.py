"""Cells at the engine's floor: the same cells run three ways in one invocation, side by side.

  floor    every cell's engine started, used and torn down one after another in ONE bare process with the same
           engine arguments and environment (bare_cell.py): no harness, no isolation; what vLLM itself costs
  process  `--isolation process`: one fresh process per cell (kvmatrix before warm workers)
  worker   `--isolation worker`: each slot's cells in a warm worker

Prints each arm's wall and per-cell wall, the ratios worker/floor (goal <= 1.3) and process/worker, and checks
that both isolations gave every cell the same verdict, resolved state and greedy tokens (tests/isolation.py).
Every arm runs in a fresh run folder; the shared compile caches are the run's cache folder, warmed by a first
unmeasured cell so that no arm pays a cold JIT the others do not.

    python benchmarks/warm_workers.py [-k PATTERN] [--arms floor,process,worker] [--jobs N] [--gpu CLASS [--emulate]]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvmatrix.harness.cli.selection import load_cells
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.paths import PACKAGE_ROOT
from kvmatrix.harness.run.executor.local import run_locally
from kvmatrix.harness.run.process.env import cell_env
from kvmatrix.harness.run.session import open_session
from kvmatrix.harness.run.task.accuracy import accuracy_spec
from kvmatrix.harness.run.task.skips import not_run_reason
from kvmatrix.harness.run.task.spec import engine_args_for, generation
from tests.isolation import isolation_differences

BARE = Path(__file__).with_name("bare_cell.py")


def floor_spec(tasks, settings) -> dict:
    """The cells the harness would run (not its skips), as bare_cell.py reads them."""
    cells = []
    for task in tasks:
        if not_run_reason(task, settings):
            continue
        engine_args = engine_args_for(task.cell, task.gpu, settings.models, settings.built, settings.use_hub,
                                      vllm_version=settings.vllm_version)
        cells.append({"cell_id": task.cell.cell_id, "engine_args": engine_args, **generation(task.cell, "full"),
                      "accuracy": accuracy_spec(task.cell, settings.use_hub)})
    return {"cells": cells}


def run_floor(tasks, settings, scratch: Path, env_extra: dict) -> tuple[float, int]:
    spec, timings, log = scratch / "floor.json", scratch / "floor-timings.json", scratch / "floor.log"
    spec.write_text(json.dumps(floor_spec(tasks, settings)))
    started = time.monotonic()
    with log.open("wb") as out:
        code = subprocess.call([sys.executable, str(BARE), str(spec), str(timings)], stdout=out,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env=cell_env(settings, env_extra), cwd=PACKAGE_ROOT)
    wall = time.monotonic() - started
    assert code == 0, log.read_text()[-3000:]
    return wall, len(json.loads(timings.read_text())["cells"])


def run_arm(tasks, settings, isolation: str, jobs: int, slot_env, scratch: Path) -> tuple[float, list[dict]]:
    arm = dataclasses.replace(settings, run_dir=RunDir(scratch / isolation), isolation=isolation)
    return run_timed(tasks, arm, isolation, jobs, slot_env)


def run_timed(tasks, settings, label: str, jobs: int, slot_env) -> tuple[float, list[dict]]:
    """The tasks through `run_locally` (a progress line each, `label` first): the wall time and the records."""
    started = time.monotonic()

    def progress(record, done, total, resumed):
        print(f"  [{label} {done:>3}/{total} {time.monotonic() - started:6.1f} s] {record['verdict']:5} "
              f"{record['cell_id']} ({record.get('process_start')})", flush=True)

    records = run_locally(tasks, settings, jobs, progress, slot_env)
    return time.monotonic() - started, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", help="cell id substring or glob (default: the whole default matrix)")
    parser.add_argument("--arms", default="floor,process,worker")
    parser.add_argument("--jobs", type=int, default=0, help="slots for process and worker (default: the class's)")
    parser.add_argument("--gpu")
    parser.add_argument("--emulate", action="store_true")
    parser.add_argument("--cache-dir", default=".cache")
    parser.add_argument("--out", help="also write the results as JSON here")
    args = parser.parse_args()
    arms = args.arms.split(",")
    selection = argparse.Namespace(cases_dir=str(PACKAGE_ROOT / "cases"), case=None, k=args.k, cell=None)
    cells, _, _ = load_cells(selection)
    scratch = Path(tempfile.mkdtemp(prefix="kvm-warm-"))
    session = open_session(gpu=args.gpu, emulate=args.emulate, run_id="warm", runs_dir=scratch,
                           cache_dir=Path(args.cache_dir).resolve())
    tasks = session.tasks(cells)
    session.build_models(tasks)
    settings, jobs = session.settings, args.jobs or session.slots().count
    whole_machine = session.slots(1).env(0)  # the floor's one bare process: every core
    slot_env = session.slots(jobs).env  # the arms' slots share the cores among `jobs`
    print(f"{len(tasks)} cells of {session.gpu_name}, vLLM {settings.vllm_version}, {jobs} slot(s), "
          f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}", flush=True)
    # Warm the shared caches (and the page cache) with one cell first: no arm pays a cold start the others skip.
    run_arm(tasks[:1], settings, "process", 1, slot_env, scratch / "warm-up")

    results: dict = {"cells": len(tasks), "jobs": jobs, "gpu_class": session.gpu_name,
                     "vllm": settings.vllm_version}
    records = {}
    if "floor" in arms:
        wall, ran = run_floor(tasks, settings, scratch, whole_machine)
        results["floor"] = {"wall_s": wall, "cells_run": ran}
        print(f"floor: {wall:.1f} s for {ran} cells in one process", flush=True)
    for isolation in ("process", "worker"):
        if isolation in arms:
            wall, records[isolation] = run_arm(tasks, settings, isolation, jobs, slot_env, scratch)
            ran = sum(r["verdict"] != "skip" for r in records[isolation])
            reruns = sum(bool(r.get("warm_attempt")) for r in records[isolation])
            results[isolation] = {"wall_s": wall, "cells_run": ran, "fresh_reruns": reruns}
            print(f"{isolation}: {wall:.1f} s for {ran} cells", flush=True)
    report(results, records)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    shutil.rmtree(scratch, ignore_errors=True)


def report(results: dict, records: dict) -> None:
    print("\n| arm | wall | cells run | per cell |\n|---|---|---|---|")
    for arm in ("floor", "process", "worker"):
        if arm in results:
            r = results[arm]
            print(f"| {arm} | {r['wall_s']:.1f} s | {r['cells_run']} | {r['wall_s'] / max(1, r['cells_run']):.2f} s |")
    if "floor" in results and "worker" in results:
        print(f"worker/floor {results['worker']['wall_s'] / results['floor']['wall_s']:.2f} (goal <= 1.3; "
              f"{results['jobs']} slot(s) against one bare process)")
    if "process" in results and "worker" in results:
        print(f"process/worker {results['process']['wall_s'] / results['worker']['wall_s']:.2f}; "
              f"{results['worker']['fresh_reruns']} cell(s) run again in a fresh process")
        results["differences"] = print_differences(records["process"], records["worker"], "in both isolations")


def print_differences(first: list[dict], second: list[dict], where: str) -> list[str]:
    """Whether two runs of the same cells resolved alike (tests/isolation.py), printed; the differences."""
    differences = isolation_differences(first, second)
    print("verdicts, resolved state and tokens: "
          + (f"identical {where}" if not differences else f"{len(differences)} DIFFERENCES"))
    for line in differences:
        print(f"  {line}")
    return differences


if __name__ == "__main__":
    main()
