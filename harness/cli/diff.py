"""`kvmatrix diff`: what changed since each GPU class's previous run in the history, or since a named run."""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import FAILED, OK, USAGE
from kvmatrix.harness.cli.output import said_unreadable
from kvmatrix.harness.record.files import RUNS_DIR
from kvmatrix.harness.results import history
from kvmatrix.harness.results.diff import Diff, diff_records
from kvmatrix.reports import diff_md, html


def add_arguments(dif: argparse.ArgumentParser) -> None:
    dif.add_argument("run", nargs="?", help="run id in the history, or a run folder (imported first); "
                                            "default: the latest run")
    dif.add_argument("--against", metavar="RUN", help="compare with this run (a run id in the history, or a run "
                                                      "folder, imported first) instead of each class's previous one")
    dif.add_argument("--db", default=str(history.DEFAULT_DB), help="the history database (default: %(default)s)")
    dif.add_argument("--gpu", action="append", help="only this GPU class; repeatable")
    dif.add_argument("--md", help="also write the Markdown to this file")
    dif.add_argument("--html", help="write the run's HTML report, with the diff at the top, to this file")
    dif.add_argument("--runs-dir", default=str(RUNS_DIR), help="where run folders (and their logs) are")
    dif.add_argument("--fail-on", choices=["new", "never"], default="new",
                     help="exit 1 when a cell newly fails (default), or never (a record file that could not be "
                          "read still exits 1)")
    dif.set_defaults(func=cmd_diff)


def imported(db: sqlite3.Connection, run: str | None) -> str | None:
    """A run id as given, or a run folder's id once the folder is imported (importing again changes nothing)."""
    if run and Path(run).is_dir():
        history.import_run(db, Path(run))
        return Path(run).name
    return run


def cmd_diff(args: argparse.Namespace) -> int:
    db = history.open_db(args.db)
    run_id = imported(db, args.run)
    args.against = imported(db, args.against)
    run_id = run_id or history.latest_run(db)
    classes = [g for g in history.classes_of(db, run_id) if not args.gpu or g in args.gpu] if run_id else []
    if not run_id:  # `kvmatrix run` does not import its runs: the nightly imports every machine's into one history
        print(f"kvmatrix: {args.db} holds no run yet: `kvmatrix diff reports/runs/<run-id>` imports that run and "
              "compares it with the one imported before it (`kvmatrix history import` imports without comparing)",
              file=sys.stderr)
        return USAGE
    if not classes:
        print(f"kvmatrix: no run {run_id} with those GPU classes in {args.db}", file=sys.stderr)
        return USAGE
    if args.against and not history.classes_of(db, args.against):
        print(f"kvmatrix: no run {args.against} in {args.db}", file=sys.stderr)
        return USAGE
    comparisons = []
    seen = history.first_seen(db)
    for gpu in classes:
        baseline = args.against or history.previous_run(db, run_id, gpu)
        if baseline and gpu not in history.classes_of(db, baseline):
            baseline = None
        diff = (diff_records(history.records_of(db, baseline, gpu), history.records_of(db, run_id, gpu), seen)
                if baseline else Diff())
        comparisons.append(diff_md.Comparison(gpu, run_id, baseline, diff))
    text = diff_md.render(comparisons, f"What changed in {run_id}")
    print(text, end="")
    if args.md:
        Path(args.md).write_text(text)
    if args.html:
        out = Path(args.html)
        # Records name their log relative to their run folder; the page may be written elsewhere.
        logs = os.path.relpath(Path(args.runs_dir) / run_id, out.parent) + "/"
        out.write_text(html.render(history.records_of(db, run_id), f"kvmatrix {run_id}", log_prefix=logs,
                                   diff=comparisons, first_seen=seen, history=history.verdict_history(db, run_id)))
    new_failures = any(c.diff.new_failures for c in comparisons)
    # A record file that could not be read is no verdict at all: said, and a failure whatever --fail-on says.
    lost = said_unreadable([r for gpu in classes for r in history.records_of(db, run_id, gpu)])
    return FAILED if lost or (new_failures and args.fail_on == "new") else OK
