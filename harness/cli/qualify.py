"""`kvmatrix qualify`: a new vLLM release against the last one. The matrix on both (or their stored runs), judged
again under this checkout's cases; the diff cell by cell; each verdict change bisected over the releases given in
between; every finding's standalone script run on the new release; the waivers it frees or must bound. One report
(qualification.md, .html, .json in --out) and an exit status: 1 where a cell newly fails or a finding is back."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from kvmatrix.harness.audit import runnable_classes
from kvmatrix.harness.bisect.envs import EnvBuildError
from kvmatrix.harness.bisect.given import parse_env_args
from kvmatrix.harness.cli.exit_codes import FAILED, OK, USAGE
from kvmatrix.harness.cli.selection import load_cells
from kvmatrix.harness.judge.waivers import WaiverError
from kvmatrix.harness.qualify.bisection import bisect_changes
from kvmatrix.harness.qualify.compare import advise, compare, judged_again
from kvmatrix.harness.qualify.qualification import Qualification
from kvmatrix.harness.qualify.recheck import SCRIPT_TIMEOUT_S, recheck, write_board
from kvmatrix.harness.qualify.registry import STATUS_FILE, load_registry, read_status, write_status
from kvmatrix.harness.qualify.sides import Side, SideError, resolve_sides, run_matrix, stored_run
from kvmatrix.harness.record.files import RUNS_DIR, write_json_atomic
from kvmatrix.harness.record.paths import DEFAULT_CACHE
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.run.cases import SelectionError, cell_selected
from kvmatrix.harness.run.session import session_waivers
from kvmatrix.matrix.load import CASES_DIR, load_pool
from kvmatrix.matrix.schema import CaseError
from kvmatrix.reports import qualification


def add_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("--env", action="append", default=[], metavar="REF=PATH",
                   help="a vLLM environment named by its release, as `kvmatrix bisect --env` takes it: a folder to "
                        "put on PYTHONPATH (or several, PYTHONPATH-style), an interpreter, or a command prefix; "
                        "repeat it: the oldest and newest are the ends unless --old / --new say, those between "
                        "are bisected over")
    q.add_argument("--old", help="the old release's --env name (default: the oldest)")
    q.add_argument("--new", help="the new release's --env name (default: the newest)")
    q.add_argument("--old-run", metavar="DIR", help="reuse this stored run of the old release (a run folder, or "
                                                    "ARCHIVE.tar.xz:FOLDER)")
    q.add_argument("--new-run", metavar="DIR", help="reuse this run of the new release (e.g. one just made)")
    q.add_argument("--gpu", help="the class to run and compare (default: this machine's; stored runs: all)")
    q.add_argument("--emulate", action="store_true", help="emulate --gpu's decisions on this machine's GPU")
    q.add_argument("--jobs", type=int, help="cells at once in each run (and scripts at once, without --script-jobs)")
    q.add_argument("-k", help="only these cells (as `kvmatrix run -k`), in the runs and the comparison")
    q.add_argument("--run-arg", action="append", default=[], metavar="ARG",
                   help="passed to `kvmatrix run` as it is (repeatable), e.g. --run-arg=--probe-only")
    q.add_argument("--cases-dir", default=str(CASES_DIR), help="the cases both runs are judged under")
    q.add_argument("--out", help="folder for the report, the runs made, bisections and scripts "
                                 "(default: reports/runs/qualify-<old>-<new>)")
    q.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="built models and compile/JIT caches")
    q.add_argument("--no-bisect", action="store_true", help="do not bisect over the releases in between")
    q.add_argument("--no-findings", action="store_true", help="do not run the findings' scripts")
    q.add_argument("--findings-status", default=str(STATUS_FILE),
                   help="what the findings' scripts did before (read; the updated copy goes to OUT/findings/); "
                        "its entries for the new release stand for scripts not run now in the waivers' advice")
    q.add_argument("--script-jobs", type=int, help="findings' scripts at once (default: --jobs, else 1)")
    q.add_argument("--script-timeout", type=float, default=SCRIPT_TIMEOUT_S, help="seconds per finding's script")
    q.add_argument("--fail-on", choices=["new", "never"], default="new",
                   help="exit 1 where a cell newly fails or a finding is back (default), or never")
    q.set_defaults(func=cmd_qualify)


def run_options(args: argparse.Namespace) -> list[str]:
    """What each `kvmatrix run` of a side is given."""
    options = ["--cases-dir", args.cases_dir, "--cache-dir", args.cache_dir]
    options += ["--gpu", args.gpu] if args.gpu else []
    options += ["--emulate"] if args.emulate else []
    options += ["--jobs", str(args.jobs)] if args.jobs else []
    options += ["-k", args.k] if args.k else []
    return options + list(args.run_arg)


def sides(args: argparse.Namespace, out: Path) -> tuple[Side, Side, list]:
    """Both ends with a run folder each (stored, or run now in their environments), and the releases between."""
    envs = parse_env_args(args.env)
    old_run = stored_run(args.old_run, out / "stored") if args.old_run else None
    new_run = stored_run(args.new_run, out / "stored") if args.new_run else None
    old, new, between = resolve_sides(envs, old_run, new_run, args.old, args.new)
    old = old if old.run else run_matrix(old, out / "runs", run_options(args))
    new = new if new.run else run_matrix(new, out / "runs", run_options(args))
    return old, new, between


def cmd_qualify(args: argparse.Namespace) -> int:
    out = Path(args.out or RUNS_DIR / "qualify")
    try:
        old, new, between = sides(args, out)
        cells, _, _ = load_cells(argparse.Namespace(cases_dir=args.cases_dir, case=None, k=args.k, cell=None),
                                 of_installed_vllm=False)
        pool = load_pool(Path(args.cases_dir))
        waivers = session_waivers(Path(args.cases_dir), pool)
        known = read_status(Path(args.findings_status))
    except (SideError, SelectionError, CaseError, WaiverError, EnvBuildError, ValueError, OSError) as err:
        print(f"kvmatrix qualify: {err}", file=sys.stderr)
        return USAGE
    by_id = {c.cell_id: c for c in cells}

    def keep(record: JudgedRecord) -> bool:
        return (not args.gpu or record.get("gpu_class") == args.gpu) and (not args.k or cell_selected(
            record["cell_id"], args.k))

    assert old.run is not None and new.run is not None  # `sides` ran what was not stored
    old_records, new_records = judged_again(old.run, by_id, pool, keep), judged_again(new.run, by_id, pool, keep)
    diff = compare(old_records, new_records, waivers)
    found = Qualification(old, new, [e.ref for e in between], old_records, new_records, diff, known=known,
                          commands=["kvmatrix qualify " + shlex.join(sys.argv[2:] if len(sys.argv) > 2 else [])])
    if not args.no_bisect:
        found.bisections = bisect_changes(found.bisected_changes(), old, new, between, _keyed(old_records),
                                          _keyed(new_records), out, Path(args.cache_dir))
    if not args.no_findings and new.env is not None:
        recheck_findings(found, args, out)
    # After the scripts: a finding they show fixed on the new release is no waiver to widen. Without scripts run
    # now, what the status file holds of the new release (a stored run qualified again) stands in.
    checks = list({(c.finding, c.gpu, c.package, c.version): c for c in [*found.known, *found.checks]}.values())
    found.waivers = [advise(w, old_records, new_records, old.ref, new.ref, waivers, checks) for w in waivers]
    data = found.as_data()
    write_report(data, out)
    return FAILED if data["fails"] and args.fail_on == "new" else OK


def _keyed(records: list[JudgedRecord]) -> dict[tuple[str, str], JudgedRecord]:
    return {(r.get("gpu_class") or "?", r["cell_id"]): r for r in records}


def recheck_findings(found: Qualification, args: argparse.Namespace, out: Path) -> None:
    """Every finding's script on the new release (the classes this machine runs or emulates); the status file and
    the board as they become, in OUT/findings/ for a person to copy over reports/findings/."""
    assert found.new.env is not None
    found.findings = load_registry()
    classes = runnable_classes(Path(args.cases_dir))
    found.checks = recheck(found.findings, classes, found.new.env, out / "findings", Path(args.cache_dir),
                           args.script_jobs or args.jobs or 1, timeout_s=args.script_timeout, native=classes[0])
    status = out / "findings" / "status.json"
    write_status(found.known + found.checks, found.findings, status)
    write_board(found.findings, read_status(status), out / "findings" / "board.md")


def write_report(data: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "qualification.json", data)
    text = qualification.markdown(data)
    (out / "qualification.md").write_text(text)
    (out / "qualification.html").write_text(qualification.html(data))
    print(text)
    print(f"reports: {out / 'qualification.md'} {out / 'qualification.html'} {out / 'qualification.json'}")
