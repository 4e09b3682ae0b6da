"""What probe-only mode saves: the same cells through `run_locally` in full (the case's prompts and tokens, the
class's KV cache) and probe-only (one prompt, 2 tokens, one sequence, the fewest KV blocks), each round in a new
run folder with shared, warm caches. Rounds alternate which mode goes first, so that drift in the machine's load
hits both alike; prints each cell's wall time side by side, the totals and their ratio, and whether each cell's
verdict and resolved state (backend, KV dtype, page size) came out the same.

    python benchmarks/probe_only.py [-k PATTERN] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from kvmatrix.harness.cli.selection import load_cells
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.paths import PACKAGE_ROOT
from kvmatrix.harness.run.executor.local import run_locally
from kvmatrix.harness.run.session import open_session
from kvmatrix.reports.summary import facts

MODES = ("full", "probe")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", default="ct-llama", help="cells whose id contains this (or matches this glob)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache-dir", default=".cache")
    args = parser.parse_args()
    selection = argparse.Namespace(cases_dir=str(PACKAGE_ROOT / "cases"), case=None, k=args.k, cell=None)
    cells, _, _ = load_cells(selection)
    scratch = Path(tempfile.mkdtemp(prefix="kvm-probe-only-"))
    session = open_session(run_id="probe-only", runs_dir=scratch, cache_dir=Path(args.cache_dir).resolve())
    tasks = session.tasks(cells)
    session.build_models(tasks)
    settings = session.settings
    cell_s: dict[str, dict[str, list[float]]] = {mode: {t.key: [] for t in tasks} for mode in MODES}
    total_s: dict[str, list[float]] = {mode: [] for mode in MODES}
    last: dict[str, list[dict]] = {}

    def run(mode: str, round_: int) -> None:
        fresh = replace(settings, run_dir=RunDir(scratch / f"{mode}-{round_}"),  # a new folder: nothing to resume
                        probe_only=mode == "probe")
        started = time.monotonic()
        records = run_locally(tasks, fresh)
        total_s[mode].append(time.monotonic() - started)
        for task, record in zip(tasks, records, strict=True):
            cell_s[mode][task.key].append((record.get("timings") or {}).get("total_s") or 0.0)
        last[mode] = records

    for round_ in range(args.rounds):
        for mode in MODES if round_ % 2 == 0 else reversed(MODES):
            run(mode, round_)
        print(f"round {round_}: full {total_s['full'][-1]:6.1f} s   probe-only {total_s['probe'][-1]:6.1f} s",
              flush=True)

    print(f"\n{'cell':<48} {'full':>8} {'probe':>8} {'ratio':>6}  same verdict and state")
    for task, full, probe in zip(tasks, last["full"], last["probe"], strict=True):
        f, p = (statistics.median(cell_s[mode][task.key]) for mode in MODES)
        same = full["verdict"] == probe["verdict"] and _state(full) == _state(probe)
        print(f"{task.cell.cell_id:<48} {f:7.2f}s {p:7.2f}s {f / p:5.2f}x  {'yes' if same else 'NO'}"
              f" ({full['verdict']}/{probe['verdict']})")
    f, p = (statistics.median(total_s[mode]) for mode in MODES)
    print(f"\n{len(tasks)} cells @{session.gpu_name}, {args.rounds} rounds, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} cores")
    print(f"median total: full {f:.1f} s, probe-only {p:.1f} s, ratio full/probe-only {f / p:.2f}x")
    shutil.rmtree(scratch, ignore_errors=True)


def _state(record: dict) -> dict:
    """The resolved facts probe-only must keep (the mode itself differs by design)."""
    return {k: v for k, v in facts(record).items() if k != "mode"}


if __name__ == "__main__":
    main()
