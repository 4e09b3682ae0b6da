"""`kvmatrix history`, `kvmatrix diff` and `kvmatrix pipeline`: the nightly's commands over the history
database (harness/nightly/history.py), what changed between runs (diff.py) and the CI definitions (pipelines.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kvmatrix.harness.nightly import history, pipelines
from kvmatrix.harness.nightly.diff import Diff, diff_records
from kvmatrix.harness.records import RUNS_DIR
from kvmatrix.matrix.load import CASES_DIR
from kvmatrix.reports import diff_md, html


def cmd_history_import(args: argparse.Namespace) -> int:
    db = history.open_db(args.db)
    for folder in args.run_dirs:
        runs = history.import_run(db, Path(folder), args.vllm_commit)
        print(f"{folder}: " + (", ".join(f"{run} @{gpu}" for run, gpu in runs) or "no records"))
    return 0


def cmd_history_runs(args: argparse.Namespace) -> int:
    print(history.runs_frame(history.open_db(args.db)).to_markdown(index=False))
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    db = history.open_db(args.db)
    run_id = args.run
    if run_id and Path(run_id).is_dir():  # a run folder: import it first (importing again changes nothing)
        history.import_run(db, Path(run_id))
        run_id = Path(run_id).name
    run_id = run_id or history.latest_run(db)
    classes = [g for g in history.classes_of(db, run_id) if not args.gpu or g in args.gpu] if run_id else []
    if not classes:
        print(f"kvmatrix: no run {run_id or ''} with those GPU classes in {args.db}", file=sys.stderr)
        return 2
    if args.against and not history.classes_of(db, args.against):
        print(f"kvmatrix: no run {args.against} in {args.db}", file=sys.stderr)
        return 2
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
    return 1 if new_failures and args.fail_on == "new" else 0


def cmd_pipeline(args: argparse.Namespace) -> int:
    stale = []
    for path, text in pipelines.generated(Path(args.cases_dir)).items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    for path in stale:
        print(f"kvmatrix: {path} is out of date: run `make pipeline`", file=sys.stderr)
    return 1 if stale else 0


def add_nightly_commands(sub: argparse._SubParsersAction) -> None:
    hist = sub.add_parser("history", help="the results history (SQLite)")
    hist_sub = hist.add_subparsers(dest="history_command", required=True)
    imp = hist_sub.add_parser("import", help="import run folders; importing each machine's folder merges them")
    imp.add_argument("run_dirs", nargs="+")
    imp.add_argument("--db", default=str(history.DEFAULT_DB))
    imp.add_argument("--vllm-commit", help="the vLLM commit the run used, where its records do not say")
    imp.set_defaults(func=cmd_history_import)
    runs = hist_sub.add_parser("runs", help="list the runs of the history with their verdict counts")
    runs.add_argument("--db", default=str(history.DEFAULT_DB))
    runs.set_defaults(func=cmd_history_runs)

    dif = sub.add_parser("diff", help="what changed since each GPU class's previous run, or since a named run")
    dif.add_argument("run", nargs="?", help="run id in the history, or a run folder (imported first); "
                                            "default: the latest run")
    dif.add_argument("--against", help="compare with this run instead of each class's previous one")
    dif.add_argument("--db", default=str(history.DEFAULT_DB))
    dif.add_argument("--gpu", action="append", help="only this GPU class; repeatable")
    dif.add_argument("--md", help="also write the Markdown to this file")
    dif.add_argument("--html", help="write the run's HTML report, with the diff at the top, to this file")
    dif.add_argument("--runs-dir", default=str(RUNS_DIR), help="where run folders (and their logs) are")
    dif.add_argument("--fail-on", choices=["new", "never"], default="new",
                     help="exit 1 when a cell newly fails (default), or never")
    dif.set_defaults(func=cmd_diff)

    pipe = sub.add_parser("pipeline", help="write the Buildkite and GitHub Actions files from the pool and cases")
    pipe.add_argument("--cases-dir", default=str(CASES_DIR))
    pipe.add_argument("--check", action="store_true", help="only check that the files are up to date")
    pipe.set_defaults(func=cmd_pipeline)
