"""`kvmatrix audit`: every FAIL / ERROR of run folders that no case or waiver explains (the records judged again
and the table are harness/audit.py's); here its arguments, what it prints and writes, and its exit status: 1 when
anything is unexplained."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvmatrix.harness.audit import rejudged, render, run_classes, runnable_classes
from kvmatrix.harness.cli.exit_codes import FAILED, OK
from kvmatrix.harness.record.files import RUNS_DIR, RunDir
from kvmatrix.harness.run.guards import cases_dir_for
from kvmatrix.matrix.load import cases_option
from kvmatrix.matrix.machine import PoolError


def add_arguments(audit: argparse.ArgumentParser) -> None:
    audit.add_argument("run_dirs", nargs="*", help="run folders to audit (judged again under the current cases)")
    audit.add_argument("--run", action="store_true",
                       help="first run the matrix for this machine's class and every class it can emulate")
    audit.add_argument("--gpu", action="append", help="with --run: only these classes; repeatable")
    audit.add_argument("--probe-only", action="store_true", help="with --run: probe-only cells")
    audit.add_argument("--cases-dir", help="the cases the runs are judged under (default: each run folder's own, the "
                                           "one it was made with)")
    audit.add_argument("--runs-dir", default=str(RUNS_DIR))
    audit.add_argument("--out", help="also write the Markdown audit to this file")
    audit.set_defaults(func=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    runs_dir = Path(args.runs_dir)
    folders = [Path(f) for f in args.run_dirs]
    if args.run:
        cases_dir = cases_dir_for(args.cases_dir)
        classes = args.gpu or runnable_classes(cases_dir)
        folders += run_classes(classes, runs_dir, (["--probe-only"] if args.probe_only else [])
                               + cases_option(cases_dir))
    if not folders:
        raise PoolError("name run folders to audit, or --run to run every class this machine can run or emulate")
    pairs_by_run = {folder.name: rejudged(RunDir(folder), cases_dir_for(args.cases_dir, folder)) for folder in folders}
    text, unexplained = render(pairs_by_run)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return FAILED if unexplained else OK
