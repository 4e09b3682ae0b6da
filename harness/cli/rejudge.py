"""`kvmatrix rejudge`: stored records judged again under the current case files, without running vLLM."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import FAILED, OK
from kvmatrix.harness.cli.output import said_unreadable
from kvmatrix.harness.cli.selection import add_selection_options, load_cells
from kvmatrix.harness.finish import write_findings, write_reports
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.guards import cases_dir_for
from kvmatrix.harness.run.rejudge import rejudge_run
from kvmatrix.harness.run.session import session_waivers
from kvmatrix.matrix.load import load_pool


def add_arguments(rej: argparse.ArgumentParser) -> None:
    add_selection_options(rej)
    rej.add_argument("run_dirs", nargs="+")
    rej.set_defaults(func=cmd_rejudge)


def cmd_rejudge(args: argparse.Namespace) -> int:
    """Judge stored records again under the current case files and signature table, without running vLLM: those
    of the folder the (first) run was made with, unless --cases-dir names another."""
    args.cases_dir = cases_dir_for(args.cases_dir, args.run_dirs[0])
    cells, _, _ = load_cells(args, of_installed_vllm=False)
    by_id = {c.cell_id: c for c in cells}
    pool = load_pool(Path(args.cases_dir))
    waivers = session_waivers(Path(args.cases_dir), pool)
    lost = False
    for folder in args.run_dirs:
        run_dir = RunDir(Path(folder))
        records = rejudge_run(run_dir, by_id, pool, waivers)
        paths = write_reports(run_dir, records, f"kvmatrix {run_dir.root.name}")
        pages = write_findings(run_dir.root, records, {run_dir.root.name: Path(args.cases_dir).resolve()})
        print(paths["md"].read_text())
        print(f"{len(pages)} unexplained failures" + (f": findings pages in {pages[0].parent}" if pages else ""))
        lost = said_unreadable(records) or lost
    return FAILED if lost else OK
