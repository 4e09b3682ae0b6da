"""`kvmatrix report`: the reports of one or more run folders as one matrix. One run folder is rendered again in
place; several go to a new folder (never into one of the runs, whose own reports would be replaced), whose links
reach each run's logs by relative paths and whose findings pages are its own."""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import FAILED, OK
from kvmatrix.harness.cli.output import said_unreadable
from kvmatrix.harness.finish import write_findings, write_reports
from kvmatrix.harness.record.files import RUNS_DIR, RunDir
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.run.guards import GuardError, cases_dir_for
from kvmatrix.reports.findings_pages import Columns


def add_arguments(rep: argparse.ArgumentParser) -> None:
    rep.add_argument("run_dirs", nargs="+")
    rep.add_argument("--out", help="folder for the reports (default: the run folder itself for one run, a new "
                                   "folder reports/report-<date>-<time> for several)")
    rep.add_argument("--title", default="kvmatrix")
    rep.add_argument("--compare-to", help="list how every other GPU class differs from this one, cell by cell")
    rep.set_defaults(func=cmd_report)


def report_folder(run_dirs: list[str], out: str | None) -> Path:
    """Where the reports go: --out, else the one run folder, else a new folder; never one of several runs."""
    runs = [Path(folder).resolve() for folder in run_dirs]
    if out is None:
        return runs[0] if len(runs) == 1 else Path(RUNS_DIR.parent / f"report-{time.strftime('%Y%m%d-%H%M%S')}")
    if len(runs) > 1 and Path(out).resolve() in runs:
        raise GuardError(f"--out {out} is one of the runs reported: its own matrix.md, matrix.html and junit.xml "
                         f"would become the report of all {len(runs)}; name a new folder")
    return Path(out)


def linked_from(out: Path, run_dir: Path, records: list[JudgedRecord]) -> list[JudgedRecord]:
    """A run's records as a report in `out` links them: each log by its path relative to `out`."""
    if out.resolve() == run_dir.resolve():
        return records
    return [{**r, "log": os.path.relpath(run_dir / r["log"], out.resolve())} if r.get("log") else r
            for r in records]


def column_per_run(runs: list[tuple[str, list[JudgedRecord]]]) -> Columns:
    """Several runs' records as one matrix, whose columns are GPU classes: where two runs hold one class, each run's
    records of it are a column of its own, named `<class> (<run id>)` (else two runs' squares of a cell would
    share one column and row), by (the records' run id, class). The records themselves keep their class (their
    findings pages say and reproduce it), their pages are named by the column."""
    runs_of = Counter(gpu for _, records in runs for gpu in {r["gpu_class"] for r in records})
    return {(str(r.get("run_id")), r["gpu_class"]): f"{r['gpu_class']} ({run_id})"
            for run_id, records in runs for r in records if runs_of[r["gpu_class"]] > 1}


def in_columns(records: list[JudgedRecord], columns: Columns) -> list[JudgedRecord]:
    """The records as the matrix shows them: each in its column."""
    return [{**r, "gpu_class": columns.get((str(r.get("run_id")), r["gpu_class"]), r["gpu_class"])} for r in records]


def cmd_report(args: argparse.Namespace) -> int:
    out = RunDir(report_folder(args.run_dirs, args.out))
    out.root.mkdir(parents=True, exist_ok=True)
    runs = [(Path(folder).resolve().name, linked_from(out.root, Path(folder).resolve(), RunDir(Path(folder)).records()))
            for folder in args.run_dirs]
    records = [r for _, run in runs for r in run]
    columns = column_per_run(runs)
    paths = write_reports(out, in_columns(records, columns), args.title, compare_to=args.compare_to)
    write_findings(out.root, records, {Path(f).resolve().name: cases_dir_for(None, f) for f in args.run_dirs},
                   {Path(f).resolve().name: Path(f) for f in args.run_dirs}, columns)
    print(paths["md"].read_text())
    print(f"reports: {paths['md']} {paths['html']} {paths['junit']}")
    return FAILED if said_unreadable(records) else OK
