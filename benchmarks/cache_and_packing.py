"""What shared compile/JIT caches and packed cells save: the same cells run twice, side by side in one
invocation, (a) one at a time with fresh empty caches per cell, then (b) packed `--jobs` at a time with the
run's shared caches. Prints both wall times and their ratio.

    python benchmarks/cache_and_packing.py [-k PATTERN] [--jobs N] [--gpu CLASS [--emulate]]

Fresh runs first, so the shared run cannot profit from what the fresh run compiled (its caches are separate);
the shared cache folder starts as it is (pass --cold-shared to empty it first).
"""

from __future__ import annotations

import argparse
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
    jobs = args.jobs or packed.slots

    fresh_s, fresh_records = timed_run(tasks, fresh, 1)
    shared_s, shared_records = timed_run(packed.tasks(cells), packed, jobs)
    same = [a["verdict"] == b["verdict"] for a, b in zip(fresh_records, shared_records, strict=True)]
    print(f"cells: {len(tasks)} on {packed.gpu_name}" + (f" (emulated on {packed.emulated_from})"
                                                         if packed.emulated_from else ""))
    print(f"(a) one at a time, fresh caches per cell: {fresh_s:8.1f} s")
    print(f"(b) {jobs} at a time, shared caches:        {shared_s:8.1f} s")
    print(f"ratio (a)/(b): {fresh_s / shared_s:.2f}x   verdicts identical: {all(same)}")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
