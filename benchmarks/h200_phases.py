"""Where a run's time went, for one or more run folders side by side (a cold run and a warm one; the runs of one
change before and after): each run's wall time, its cells' seconds summed by phase (harness/record/phases.py), the
cells that paid a cold compile, and whether the runs gave every cell the same verdict.

    PYTHONPATH=. python benchmarks/h200_phases.py RUN [RUN ...] [--same-as RUN [--rejudge]]

A RUN is a run folder or a packed one (`.tar.xz`, as tests/fixtures/runs/ keeps them; a folder inside it is named
with `ARCHIVE:FOLDER`). Records written before the phase timings existed get theirs from the cell logs the folder
kept (vLLM's own lines, harness/vllm_compat/phase_log.py), as far as the logs were kept. `--same-as` names the
run whose verdicts the others must match (a slow run before a speed change): the differences are listed, one line
a cell. `--rejudge` judges that run's records again under this checkout's case files and waivers first (a copy of
them, as `kvmatrix rejudge` does), so that a run made before today's waivers is compared as it would be judged
now. Reads files only: it runs on the GPU machine or on run folders fetched from it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tarfile
import tempfile
from datetime import datetime
from pathlib import Path

from kvmatrix.harness.record.phases import DETAILS, PART_TITLES, PARTS, summed
from kvmatrix.harness.vllm_compat.phase_log import engine_phases


def open_run(spec: str, scratch: Path) -> Path:
    """A run folder from RUN (a folder, an archive holding one, or ARCHIVE:FOLDER)."""
    stem, _, inner = spec.partition(".tar.xz:")
    if spec.endswith(".tar.xz") or inner:
        archive = Path(stem + ".tar.xz") if inner else Path(spec)
        target = scratch / archive.name
        if not target.exists():
            with tarfile.open(archive) as packed:
                packed.extractall(target, filter="data")
        folders = sorted(p.parent for p in target.rglob("run.json"))
        chosen = [f for f in folders if not inner or f.name == inner or str(f).endswith(inner)]
        if len(chosen) != 1:
            raise SystemExit(f"{spec}: holds run folders {[f.name for f in folders]}: name one as ARCHIVE:FOLDER")
        return chosen[0]
    return Path(spec)


def rejudged(run: Path, scratch: Path) -> Path:
    """A copy of the run folder with every record judged again under this checkout's cases and waivers (twice:
    a compared cell reads its oracle's or twin's record, which the first pass may have judged anew)."""
    from kvmatrix.harness.judge.waivers import load_waivers
    from kvmatrix.harness.record.files import RunDir
    from kvmatrix.harness.run.rejudge import rejudge_run
    from kvmatrix.matrix.expand import expand_all
    from kvmatrix.matrix.load import load_cases, load_models, load_pool

    copy = scratch / f"rejudged-{run.name}" / run.name
    if not copy.exists():
        shutil.copytree(run, copy)
        pool = load_pool()
        cells = {c.cell_id: c for c in expand_all(load_cases(), load_models(), pool)}
        waivers = load_waivers(gpu_classes=pool)
        for _ in range(2):
            rejudge_run(RunDir(copy), cells, pool, waivers)
    return copy


def records_of(run: Path) -> list[dict]:
    """The run's records, each with the phase timings its log shows where the record has none."""
    records = []
    for path in sorted(run.glob("*.json")):
        if path.name == "run.json":
            continue
        record = json.loads(path.read_text())
        timings = record.get("timings") or {}
        log = run / record["log"] if record.get("log") else None
        if timings and "engine_core_s" not in timings and log is not None and log.is_file():
            record["timings"] = {**engine_phases(log.read_text(errors="replace"), record.get("vllm_version")),
                                 **timings}
        records.append(record)
    return records


def busy_wall(records: list[dict]) -> float:
    """Seconds during which at least one cell ran: the union of the cells' intervals (a run resumed in a second
    call counts without the pause between the calls)."""
    spans = []
    for r in records:
        total = (r.get("timings") or {}).get("total_s")
        if total and r.get("finished_at"):
            end = datetime.fromisoformat(r["finished_at"].replace("Z", "+00:00")).timestamp()
            spans.append((end - total, end))
    wall, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        wall += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return wall


def column(records: list[dict]) -> dict[str, float]:
    parts, details, ran = summed(r.get("timings") for r in records)
    timed = [r for r in records if "engine_core_s" in (r.get("timings") or {})]
    return {**parts, **details, "cells": ran, "with phases": len(timed), "wall": busy_wall(records),
            "cell-seconds": sum(parts.values()),
            "compiled by Inductor": sum(1 for r in records if (r.get("timings") or {}).get("inductor_s")),
            "built FlashInfer kernels": sum(1 for r in records if (r.get("timings") or {}).get("flashinfer_jit_s"))}


def verdict_differences(reference: list[dict], other: list[dict]) -> list[str]:
    theirs = {r["cell_id"]: r.get("verdict") for r in other}
    return [f"{r['cell_id']}: {r.get('verdict')} -> {theirs[r['cell_id']]}" for r in reference
            if r["cell_id"] in theirs and theirs[r["cell_id"]] != r.get("verdict")]


def print_table(names: list[str], columns: list[dict[str, float]]) -> None:
    rows = ["wall", "cells", "with phases", "cell-seconds", *PARTS, *DETAILS, "compiled by Inductor",
            "built FlashInfer kernels"]
    titles = {**PART_TITLES, **{d: f"  of which {d.removesuffix('_s')}" for d in DETAILS},
              "wall": "busy wall (s)", "cpu_s": "  CPU-s of the cells' processes"}
    width = min(72, max(len(titles.get(r, r)) for r in rows))
    print(f"{'':{width}}  " + "  ".join(f"{n[-22:]:>22}" for n in names))
    for row in rows:
        print(f"{titles.get(row, row)[:width]:{width}}  " + "  ".join(f"{c[row]:>22.0f}" for c in columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--same-as", help="run whose verdicts every run must match")
    parser.add_argument("--rejudge", action="store_true",
                        help="judge the --same-as run again under this checkout's cases and waivers first")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="kvm-phases-"))
    folders = [open_run(spec, scratch) for spec in args.runs]
    runs = {folder.name: records_of(folder) for folder in folders}
    print_table(list(runs), [column(records) for records in runs.values()])
    if args.same_as:
        reference_folder = open_run(args.same_as, scratch)
        if args.rejudge:
            reference_folder = rejudged(reference_folder, scratch)
        reference = records_of(reference_folder)
        for name, records in runs.items():
            differences = verdict_differences(reference, records)
            shared = len({r["cell_id"] for r in reference} & {r["cell_id"] for r in records})
            print(f"\nverdicts of {name} against {reference_folder.name}: {shared} cells in both, "
                  f"{len(differences)} differ" + "".join(f"\n  {line}" for line in differences))


if __name__ == "__main__":
    main()
