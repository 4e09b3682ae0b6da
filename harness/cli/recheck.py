"""`kvmatrix recheck`: every finding's standalone script written for a vLLM and run there (harness/qualify/recheck.py),
what each did added to reports/findings/status.json, and the status board of reports/findings/README.md written
again."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvmatrix.harness.audit import runnable_classes
from kvmatrix.harness.bisect.envs import EnvBuildError
from kvmatrix.harness.bisect.given import parse_env_args
from kvmatrix.harness.cli.exit_codes import FAILED, OK, USAGE
from kvmatrix.harness.qualify.recheck import (
    DRAFTS,
    README,
    SCRIPT_TIMEOUT_S,
    recheck,
    this_python,
    write_board,
    write_drafts,
)
from kvmatrix.harness.qualify.registry import REGISTRY_FILE, STATUS_FILE, load_registry, read_status, write_status
from kvmatrix.harness.record.paths import DEFAULT_CACHE
from kvmatrix.matrix.load import CASES_DIR
from kvmatrix.matrix.schema import CaseError


def cmd_recheck(args: argparse.Namespace) -> int:
    try:
        findings = load_registry(Path(args.registry))
        checks = read_status(Path(args.status))
        if not args.board_only:
            env = parse_env_args([args.env])[0] if args.env else this_python()
            here = runnable_classes(CASES_DIR)  # this machine's own class first, then those it can emulate
            classes = [c for c in here if not args.gpu or c in args.gpu]
            checks += recheck(findings, classes, env, Path(args.out), Path(args.cache_dir), args.jobs, args.finding,
                              args.timeout, native=here[0])
            write_status(checks, findings, Path(args.status))
        if args.drafts:
            write_drafts(findings, read_status(Path(args.status)), Path(args.drafts), Path(args.cache_dir))
    except (CaseError, EnvBuildError, ValueError) as err:
        print(f"kvmatrix recheck: {err}", file=sys.stderr)
        return USAGE
    print(write_board(findings, read_status(Path(args.status)), Path(args.readme)))
    return FAILED if any(c.outcome == "no verdict" for c in checks if not args.board_only) else OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`kvmatrix recheck`'s arguments (harness/cli/commands.py lists the command)."""
    p.add_argument("--env", metavar="REF=PATH", help="the vLLM to run the scripts with, as `kvmatrix bisect --env` "
                                                     "takes it (default: the Python kvmatrix runs in)")
    p.add_argument("--gpu", action="append", help="only scripts for this class (repeatable; default: every class "
                                                  "this machine can run or emulate)")
    p.add_argument("--finding", action="append", help="only this finding (repeatable)")
    p.add_argument("--jobs", type=int, default=1, help="scripts at once")
    p.add_argument("--timeout", type=float, default=SCRIPT_TIMEOUT_S, help="seconds per script")
    p.add_argument("--out", default="reports/runs/recheck", help="folder for the scripts, their issue drafts, logs")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="built models and compile/JIT caches")
    p.add_argument("--registry", default=str(REGISTRY_FILE))
    p.add_argument("--status", default=str(STATUS_FILE), help="what scripts did, by release (updated)")
    p.add_argument("--readme", default=str(README), help="the page whose status board is written again")
    p.add_argument("--board-only", action="store_true", help="write the board from the status file, run nothing")
    p.add_argument("--drafts", metavar="DIR", nargs="?", const=str(DRAFTS), default=None,
                   help=f"also write every finding's script and issue draft as of its newest run into DIR "
                        f"(default {DRAFTS.relative_to(DRAFTS.parents[2])})")
    p.set_defaults(func=cmd_recheck)
