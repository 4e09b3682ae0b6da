"""`kvmatrix history import|runs`: the results history (SQLite, harness/nightly/history.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import OK
from kvmatrix.harness.nightly import history


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
    db = history.open_db(args.db)
    for folder in args.run_dirs:
        runs = history.import_run(db, Path(folder), args.vllm_commit)
        print(f"{folder}: " + (", ".join(f"{run} @{gpu}" for run, gpu in runs) or "no records"))
    return OK


def cmd_history_runs(args: argparse.Namespace) -> int:
    print(history.runs_frame(history.open_db(args.db)).to_markdown(index=False))
    return OK
