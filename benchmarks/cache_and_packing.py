"""What shared compile/JIT caches and packed cells save: the same cells run three times, side by side in one
invocation: (a) one at a time with fresh empty caches per cell, (b) one at a time with the run's shared caches,
(c) packed `--jobs` at a time with the shared caches. Prints the wall times and the ratios a/b (cache sharing),
b/c (packing) and a/c (both: a nightly's saving).

    python benchmarks/cache_and_packing.py [-k PATTERN] [--jobs N] [--gpu CLASS [--emulate]]

`--jobs` defaults to the machine's slots (at least 2, so that a CPU machine packs too). Fresh runs go first, so
the shared runs cannot profit from what the fresh run compiled (its caches are separate); the shared cache
folder starts as it is (pass --cold-shared to empty it first: then (b) compiles and (c) reuses).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from harness.cli import load_cells
from harness.runner import run_tasks
from harness.session import open_session


def timed_run(tasks, session, jobs: int) -> tuple[float, list[dict]]:
    started = time.monotonic()
    records = run_tasks(tasks, session.settings, jobs=jobs, slot_env=session.slot_env)
    return time.monotonic() - started, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", default="")
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--gpu")
    parser.add_argument("--emulate", action="store_true")
    parser.add_argument("--cache-dir", default=".cache")
    parser.add_argument("--cold-shared", action="store_true", help="empty the shared caches before (b)")
    args = parser.parse_args()
    selection = argparse.Namespace(cases_dir=str(Path("cases").resolve()), case=None, k=args.k, cell=None)
    cells, _, _ = load_cells(selection)
    scratch = Path(tempfile.mkdtemp(prefix="kvm-bench-"))
    shared_cache = Path(args.cache_dir).resolve()

    fresh = open_session(args.gpu, args.emulate, "fresh", scratch / "runs", scratch / "caches")
    fresh.settings.fresh_caches = True
    tasks = fresh.tasks(cells)
    packed = open_session(args.gpu, args.emulate, "shared", scratch / "runs", shared_cache)
    if args.cold_shared:
        for sub in ("vllm", "flashinfer", "inductor", "triton"):
            shutil.rmtree(shared_cache / sub, ignore_errors=True)
    packed.build_models(tasks)  # models are built once for both: building is not what is measured
    fresh.settings.built = packed.settings.built
    jobs = args.jobs or max(2, packed.slots)
    serial = open_session(args.gpu, args.emulate, "shared-serial", scratch / "runs", shared_cache)
    serial.settings.built = packed.settings.built

    fresh_s, fresh_records = timed_run(tasks, fresh, 1)
    serial_s, serial_records = timed_run(serial.tasks(cells), serial, 1)
    packed_s, packed_records = timed_run(packed.tasks(cells), packed, jobs)
    verdicts = [[r["verdict"] for r in records] for records in (fresh_records, serial_records, packed_records)]
    print(f"cells: {len(tasks)} on {packed.gpu_name}" + (f" (emulated on {packed.emulated_from})"
                                                         if packed.emulated_from else "")
          + f"; load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} cores")
    print(f"(a) one at a time, fresh caches per cell: {fresh_s:8.1f} s")
    print(f"(b) one at a time, shared caches:         {serial_s:8.1f} s")
    print(f"(c) {jobs} at a time, shared caches:          {packed_s:8.1f} s")
    print(f"cache sharing (a)/(b): {fresh_s / serial_s:.2f}x   packing (b)/(c): {serial_s / packed_s:.2f}x   "
          f"both (a)/(c): {fresh_s / packed_s:.2f}x   verdicts identical: {verdicts[0] == verdicts[1] == verdicts[2]}")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
