"""The parts of benchmarks/h200_matrix.sh that read the harness: this machine's GPU class, the start order a cold
run borrows from an earlier run, and the one line that says how a run went.

    PYTHONPATH=. python benchmarks/gpu_matrix_call.py class "NVIDIA H100 80GB HBM3"
    PYTHONPATH=. python benchmarks/gpu_matrix_call.py slots CLASS MEMORY_MIB CORES
    PYTHONPATH=. python benchmarks/gpu_matrix_call.py reference RUN FOLDER
    PYTHONPATH=. python benchmarks/gpu_matrix_call.py seed REFERENCE CACHE_DIR CLASS
    PYTHONPATH=. python benchmarks/gpu_matrix_call.py summary RUN REFERENCE GOAL_S CALL_S [CALL_S ...]

`class`: the pool class whose names match the driver's name (as `kvmatrix run` picks it; nvidia-smi gives the
name without importing torch).
`slots`: how many cells `kvmatrix run` packs on one such GPU (harness/run/host/slots.py), for the scaling model.
`reference`: RUN (a run folder or `ARCHIVE.tar.xz:FOLDER`, benchmarks/h200_phases.py) judged again under today's
cases and waivers into FOLDER: what the other two compare with and borrow from (a REFERENCE).
`seed`: the last-run file of CLASS under CACHE_DIR (harness/run/last_run.py) written from REFERENCE's records
judged under today's cases: each cell's wall time, verdict and attention backend there. A run on an empty cache
folder then starts its cells longest first and knows its kernel families, as a nightly machine's run does from its
history, while every kernel is still compiled from nothing.
`summary`: cells run, the busy wall and the calls' walls against the goal, the verdict counts, and whether every
cell both runs ran got REFERENCE's verdict.
"""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import tempfile
from collections import Counter
from pathlib import Path

from h200_phases import busy_wall, open_run, records_of, rejudged, verdict_differences  # beside this script

from kvmatrix.harness.run.host.slots import slot_count
from kvmatrix.harness.run.last_run import last_run_file, remember
from kvmatrix.harness.vllm_compat import installed_vllm_version
from kvmatrix.matrix.load import load_pool

VERDICT_ORDER = ("pass", "xfail", "fail", "error", "skip")


def gpu_class(driver_name: str) -> str:
    for name, gpu in load_pool().items():
        if gpu.device == "cuda" and any(fnmatch.fnmatchcase(driver_name.strip(), glob) for glob in gpu.names):
            return name
    raise SystemExit(f"no GPU class of cases/_pool.yaml names {driver_name!r}")


def reference(spec: str, folder: Path) -> Path:
    """RUN judged again under today's cases, as a plain run folder at FOLDER (kept: made once per machine)."""
    if not (folder / "run.json").exists():
        scratch = Path(tempfile.mkdtemp(prefix="kvm-reference-"))
        shutil.copytree(rejudged(open_run(spec, scratch), scratch), folder, dirs_exist_ok=True)
    return folder


def seed(reference: Path, cache_dir: Path, gpu: str) -> None:
    path = last_run_file(cache_dir, gpu, installed_vllm_version())
    kept = [r for r in records_of(reference) if r.get("verdict") != "skip"]
    for record in kept:
        remember(path, record)
    print(f"start order from {reference}: {len(kept)} cells' walls, verdicts and backends in {path}")


def summary(run: Path, reference: Path, goal_s: float, calls_s: list[float]) -> str:
    records = records_of(run)
    ran = [r for r in records if r.get("verdict") != "skip" and (r.get("timings") or {}).get("total_s")]
    counts = Counter(r.get("verdict") for r in records)
    busy = busy_wall(records)
    wall = sum(calls_s)
    theirs = records_of(reference)
    differences = verdict_differences(theirs, records)
    shared = len({r["cell_id"] for r in theirs} & {r["cell_id"] for r in records})
    gpus = sorted({r.get("gpu_class", "?") for r in records})
    versions = sorted({r.get("vllm_version") or "?" for r in ran})
    return (f"SUMMARY {run.name} on {'/'.join(gpus)}, vLLM {'/'.join(versions)}: {len(ran)} of {len(records)} cells "
            f"run; wall {wall:.0f} s in {len(calls_s)} call(s) ({'+'.join(f'{c:.0f}' for c in calls_s)}), busy "
            f"{busy:.0f} s; goal {goal_s:.0f} s {'met' if wall <= goal_s else 'NOT met'}; "
            + " ".join(f"{v} {counts.get(v, 0)}" for v in VERDICT_ORDER)
            + f"; verdicts identical to the reference's: {'yes' if not differences else 'NO'} "
            f"({shared} cells in both, {len(differences)} differ)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("class").add_argument("driver_name")
    packing = commands.add_parser("slots")
    packing.add_argument("gpu")
    packing.add_argument("memory_mib", type=float)
    packing.add_argument("cores", type=int)
    judging = commands.add_parser("reference")
    judging.add_argument("run")
    judging.add_argument("folder", type=Path)
    seeding = commands.add_parser("seed")
    seeding.add_argument("reference", type=Path)
    seeding.add_argument("cache_dir", type=Path)
    seeding.add_argument("gpu")
    summing = commands.add_parser("summary")
    summing.add_argument("run", type=Path)
    summing.add_argument("reference", type=Path)
    summing.add_argument("goal_s", type=float)
    summing.add_argument("calls_s", type=float, nargs="+")
    args = parser.parse_args()
    if args.command == "class":
        print(gpu_class(args.driver_name))
    elif args.command == "slots":
        print(slot_count(load_pool()[args.gpu], 1, args.cores, args.memory_mib / 1024))
    elif args.command == "reference":
        print(reference(args.run, args.folder))
    elif args.command == "seed":
        seed(args.reference, args.cache_dir, args.gpu)
    else:
        print(summary(args.run, args.reference, args.goal_s, args.calls_s))


if __name__ == "__main__":
    main()
