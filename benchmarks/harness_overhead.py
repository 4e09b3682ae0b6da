"""What kvmatrix adds to one cell: the same cell run through the harness (`run_locally` with one task: spec file,
cell process with its probe and phase records, judging, the record write) against a bare script that starts
vLLM in-process with the same engine arguments and environment, generates and exits. Runs alternate
(harness then bare, bare then harness, ...) so that drift in the machine's load hits both sides alike; prints
each run, the medians and their ratio (goal: within 10%).

    python benchmarks/harness_overhead.py [--cell ID] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from kvmatrix.harness.cli.selection import load_cells
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.paths import PACKAGE_ROOT
from kvmatrix.harness.run.executor.local import run_locally
from kvmatrix.harness.run.process.env import cell_env
from kvmatrix.harness.run.session import open_session
from kvmatrix.harness.run.task.spec import engine_args_for

BARE = Path(__file__).with_name("bare_cell.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cell", default="ct-llama[kv=auto,skip=-,spec=-]")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--cache-dir", default=".cache")
    args = parser.parse_args()
    selection = argparse.Namespace(cases_dir=str(PACKAGE_ROOT / "cases"), case=None, k=None, cell=[args.cell])
    cells, _, _ = load_cells(selection)
    scratch = Path(tempfile.mkdtemp(prefix="kvm-overhead-"))
    session = open_session(run_id="overhead", runs_dir=scratch, cache_dir=Path(args.cache_dir).resolve())
    (task,) = session.tasks(cells)
    session.build_models([task])
    settings = session.settings
    spec = scratch / "bare.json"
    spec.write_text(json.dumps({
        "engine_args": engine_args_for(task.cell, task.gpu, settings.models, settings.built),
        "prompts": task.cell.case.generate.prompts, "max_tokens": task.cell.case.generate.max_tokens,
    }))

    def through_harness(i: int) -> float:
        fresh = replace(settings, run_dir=RunDir(scratch / f"harness-{i}"))  # a new folder: nothing to resume
        started = time.monotonic()
        (record,) = run_locally([task], fresh)
        took = time.monotonic() - started
        assert record["status"] == "ok", record.get("error_tail")
        phases["harness"].append(record["timings"])
        return took

    def bare(i: int) -> float:
        log, timings = scratch / f"bare-{i}.log", scratch / f"bare-{i}.json"
        started = time.monotonic()
        with log.open("wb") as out:
            code = subprocess.call([sys.executable, str(BARE), str(spec), str(timings)], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=cell_env(settings),
                                   cwd=PACKAGE_ROOT)
        took = time.monotonic() - started
        assert code == 0, log.read_text()[-2000:]
        phases["bare"].append(json.loads(timings.read_text()))
        return took

    phases: dict[str, list[dict]] = {"harness": [], "bare": []}
    through_harness(-1)  # warm the page cache and the compile caches for both sides alike; not counted
    harness_s, bare_s = [], []
    for i in range(args.repeats):
        if i % 2:  # bare first every other round: neither side always runs right after the other
            bare_s.append(bare(i))
            harness_s.append(through_harness(i))
        else:
            harness_s.append(through_harness(i))
            bare_s.append(bare(i))
        print(f"run {i}: harness {harness_s[-1]:6.2f} s   bare {bare_s[-1]:6.2f} s", flush=True)
    phases["harness"].pop(0)  # the warm-up's
    for phase in ("import_s", "init_s", "generate_s"):  # where a difference lives: inside vLLM or around it
        hp, bp = (statistics.median(t[phase] for t in phases[side]) for side in ("harness", "bare"))
        print(f"  {phase:<11} harness {hp:6.2f} s   bare {bp:6.2f} s")
    h, b = statistics.median(harness_s), statistics.median(bare_s)
    print(f"cell {task.cell.cell_id} @{task.gpu_name}, {args.repeats} runs each, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} cores")
    print(f"median: harness {h:.2f} s, bare {b:.2f} s, ratio harness/bare {h / b:.3f} "
          f"(overhead {100 * (h / b - 1):+.1f}%, goal within 10%)")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
