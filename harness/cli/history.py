"""`kvmatrix history import|runs`: the results history (SQLite, harness/results/history.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import FAILED, OK
from kvmatrix.harness.cli.output import said_unreadable
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.results import history


def add_arguments(hist: argparse.ArgumentParser) -> None:
    hist_sub = hist.add_subparsers(dest="history_command", required=True)
    imp = hist_sub.add_parser("import", help="import run folders; importing each machine's folder merges them")
    imp.add_argument("run_dirs", nargs="+")
    imp.add_argument("--db", default=str(history.DEFAULT_DB))
    imp.add_argument("--vllm-commit", help="the vLLM commit the run used, where its records do not say")
    imp.set_defaults(func=cmd_history_import)
    runs = hist_sub.add_parser("runs", help="list the runs of the history with their verdict counts")
    runs.add_argument("--db", default=str(history.DEFAULT_DB))
    runs.set_defaults(func=cmd_history_runs)


def cmd_history_import(args: argparse.Namespace) -> int:
    """A record file that cannot be read is imported as its cell's error, said, and makes the exit status 1."""
    db = history.open_db(args.db)
    lost = False
    for folder in args.run_dirs:
        run_dir = RunDir(Path(folder))
        records = run_dir.records()
        runs = history.import_records(db, records, run_dir.root.name, args.vllm_commit)
        print(f"{folder}: " + (", ".join(f"{run} @{gpu}" for run, gpu in runs) or "no records"))
        lost = said_unreadable(records) or lost
    return FAILED if lost else OK


def cmd_history_runs(args: argparse.Namespace) -> int:
    print(history.runs_frame(history.open_db(args.db)).to_markdown(index=False))
    return OK
