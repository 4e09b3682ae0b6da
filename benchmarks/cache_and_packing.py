"""What shared compile/JIT caches and packed cells save: the same cells run up to three times, side by side in one
invocation: (a) one at a time with fresh empty caches per cell, (b) one at a time with one cache shared by the
arm's cells, (c) packed `--jobs` at a time with one shared cache, the cores shared among its slots. Prints the
wall times, the ratios a/b (cache sharing), b/c (packing) and a/c (both: what a nightly saves), and whether every
arm gave every cell the same record (verdict, resolved state, greedy tokens).

    python benchmarks/cache_and_packing.py [-k PATTERN] [--case NAME ...] [--cell ID ...] [--arms abc]
                                           [--jobs N] [--gpu CLASS [--emulate]] [--warm-shared DIR]
                                           [--isolation worker|process]

(b) and (c) run their cells as `kvmatrix run` does (warm workers) unless `--isolation process`; (a) always runs
one fresh process per cell, whose caches are its own.

Every arm starts cold, as on a fresh CI machine: each shared arm gets its own empty cache folder, so it compiles
what it needs once and its later cells reuse it; nothing one arm compiled serves another. `--warm-shared DIR`
runs (b) and (c) on an existing cache instead (a machine that keeps its cache between nightlies). Before the
arms, one untimed process imports torch and vLLM (and initialises CUDA on a GPU), so that the first arm does not
pay alone for reading the libraries from disk. `--arms ac` skips (b) where device time is short.
`--jobs` defaults to the machine's slots (at least 2, so that a CPU machine packs too).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from kvmatrix.harness.cli.selection import load_cells
from kvmatrix.harness.record.paths import PACKAGE_ROOT
from kvmatrix.harness.run.cases import cell_selected
from kvmatrix.harness.run.executor.local import run_locally
from kvmatrix.harness.run.session import open_session
from tests.isolation import isolation_differences

WARM_UP = "import torch, vllm; torch.cuda.init() if torch.cuda.is_available() else None"
ARM_TITLES = {
    "a": "one at a time, fresh caches per cell",
    "b": "one at a time, one shared cache",
    "c": "{jobs} at a time, one shared cache",
}


def timed_run(session, cells, jobs: int) -> tuple[float, list[dict]]:
    slots = session.slots(jobs)  # the cores shared among this arm's slots
    started = time.monotonic()
    records = run_locally(session.tasks(cells), session.settings, jobs=jobs, slot_env=slots.env)
    return time.monotonic() - started, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", help="cells whose id contains this (or matches this glob)")
    parser.add_argument("--case", action="append", help="the cells of this case (file stem); repeatable")
    parser.add_argument("--cell", action="append", help="this exact cell id; repeatable")
    parser.add_argument("--arms", default="abc", help="which of a, b, c to run (default: all three)")
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--gpu")
    parser.add_argument("--emulate", action="store_true")
    parser.add_argument("--cache-dir", default=".cache", help="where the built models are")
    parser.add_argument("--warm-shared", help="run (b) and (c) on this existing cache folder")
    parser.add_argument("--isolation", choices=("worker", "process"), default="worker",
                        help="how each arm runs its cells (default: warm workers, as `kvmatrix run`)")
    args = parser.parse_args()
    arms = [arm for arm in "abc" if arm in args.arms]
    _, _, every = load_cells(argparse.Namespace(cases_dir=str(PACKAGE_ROOT / "cases"), case=None, k=None, cell=None))
    # A union, unlike `kvmatrix run` (which narrows): a benchmark mixes whole cases with single cells.
    cells = [c for c in every if (args.case and c.case.name in args.case) or (args.cell and c.cell_id in args.cell)
             or (args.k and cell_selected(c.cell_id, args.k))]
    if not cells:
        parser.error("no cell selected: give -k, --case or --cell")
    scratch = Path(tempfile.mkdtemp(prefix="kvm-bench-"))

    def session(arm: str):
        caches = Path(args.warm_shared).resolve() if args.warm_shared and arm != "a" else scratch / f"caches-{arm}"
        s = open_session(gpu=args.gpu, emulate=args.emulate, run_id=f"arm-{arm}", runs_dir=scratch / "runs",
                         cache_dir=caches)
        # Fresh caches per cell need a fresh process per cell: a warm worker keeps the caches it started with.
        s.settings = replace(s.settings, fresh_caches=arm == "a",
                             isolation="process" if arm == "a" else args.isolation)
        return s

    sessions = {arm: session(arm) for arm in arms}
    first = sessions[arms[0]]
    # Models are built once, into the usual folder: building is not what is measured.
    builder = open_session(gpu=args.gpu, emulate=args.emulate, run_id="build", runs_dir=scratch / "runs",
                           cache_dir=Path(args.cache_dir).resolve())
    builder.build_models(first.tasks(cells))
    for s in sessions.values():
        s.settings = replace(s.settings, built=builder.settings.built)
    jobs = args.jobs or max(2, first.slots().count)
    subprocess.run([sys.executable, "-c", WARM_UP], check=True, cwd=PACKAGE_ROOT)

    print(f"cells: {len(first.tasks(cells))} on {first.gpu_name}"
          + (f" (emulated on {first.emulated_from})" if first.emulated_from else "")
          + f"; caches: {'warm ' + args.warm_shared if args.warm_shared else 'cold per arm'}", flush=True)
    walls, records = {}, {}
    for arm in arms:  # each arm's line as soon as it ends: a run stopped by a time limit keeps what it measured
        walls[arm], records[arm] = timed_run(sessions[arm], cells, jobs if arm == "c" else 1)
        print(f"({arm}) {ARM_TITLES[arm].format(jobs=jobs):40s} {walls[arm]:8.1f} s", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} cores")
    ratios = [f"{name} ({x})/({y}): {walls[x] / walls[y]:.2f}x"
              for name, x, y in (("cache sharing", "a", "b"), ("packing", "b", "c"), ("both", "a", "c"))
              if x in walls and y in walls]
    # Verdicts, resolved state and greedy tokens (tests/isolation.py): packing must not change a record.
    differences = {arm: isolation_differences(records[arms[0]], records[arm]) for arm in arms[1:]}
    print("   ".join(ratios) + "   records identical: " + str(not any(differences.values())))
    for arm, lines in differences.items():
        for line in lines:
            print(f"({arms[0]}) vs ({arm}): {line}")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
