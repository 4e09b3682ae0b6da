"""`kvmatrix report`: the reports of one or more run folders as one matrix."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import FAILED, OK
from kvmatrix.harness.cli.output import records_in, said_unreadable, write_reports
from kvmatrix.harness.record.files import RunDir


def add_arguments(rep: argparse.ArgumentParser) -> None:
    rep.add_argument("run_dirs", nargs="+")
    rep.add_argument("--out", help="folder for the reports (default: the first run folder)")
    rep.add_argument("--title", default="kvmatrix")
    rep.add_argument("--compare-to", help="list how every other GPU class differs from this one, cell by cell")
    rep.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    records = records_in(args.run_dirs)
    run_dir = RunDir(Path(args.out or args.run_dirs[0]))
    run_dir.root.mkdir(parents=True, exist_ok=True)
    paths = write_reports(run_dir, records, args.title, compare_to=args.compare_to)
    print(paths["md"].read_text())
    return FAILED if said_unreadable(records) else OK
