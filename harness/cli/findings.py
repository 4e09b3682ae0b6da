"""`kvmatrix findings`: a findings page for every unexplained failure of run folders, reproducible as printed."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import FAILED, OK
from kvmatrix.harness.cli.output import records_in, said_unreadable
from kvmatrix.harness.run.guards import cases_dir_for
from kvmatrix.reports import findings_pages


def add_arguments(fin: argparse.ArgumentParser) -> None:
    fin.add_argument("run_dirs", nargs="+")
    fin.add_argument("--out", default=str(findings_pages.FINDINGS_DIR / "pages"), help="folder for the pages")
    fin.set_defaults(func=cmd_findings)


def cmd_findings(args: argparse.Namespace) -> int:
    records = records_in(args.run_dirs)
    pages = findings_pages.write(records, Path(args.out), {Path(f).name: cases_dir_for(None, f) for f in args.run_dirs},
                                 {Path(f).name: Path(f) for f in args.run_dirs})
    print(f"{len(pages)} unexplained failures" + (f": pages and an index in {args.out}" if pages else ""))
    return FAILED if said_unreadable(records) else OK
