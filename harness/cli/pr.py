"""`kvmatrix pr`: run the cells a vLLM change touches at its base and head, and diff them. The selection and the
two sides' runs are harness/pr/base_head.py's; here its arguments, what it prints and its exit status (1 when a
cell fails at HEAD that did not at BASE)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import FAILED, OK, USAGE
from kvmatrix.harness.pr.base_head import PrError, run_pr
from kvmatrix.harness.record.files import RUNS_DIR
from kvmatrix.harness.record.paths import DEFAULT_CACHE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repo", type=Path, required=True, help="a vLLM git checkout")
    p.add_argument("--base", required=True, help="the commit the change starts from")
    p.add_argument("--head", help="the commit the change ends at")
    p.add_argument("--patch", type=Path, help="a patch (git diff) applied on --base instead of --head")
    p.add_argument("--records", type=Path, required=True,
                   help="a run folder whose records say what each cell resolved (e.g. the last nightly run), "
                        "or a history database (its latest run)")
    p.add_argument("--select-only", action="store_true", help="print the selection and why, run nothing")
    p.add_argument("--base-ref", help="the commit the installed vLLM was built from (default: --base); "
                                      "compiled changes since it cannot be overlaid")
    p.add_argument("--folder", type=Path, help="where the selection, steps, logs and result go")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="cached environments and models")
    p.set_defaults(func=cmd_pr)


def _say(text: str) -> None:
    print(text, flush=True)  # at once: the cells' runs come after it


def cmd_pr(args: argparse.Namespace) -> int:
    if bool(args.head) == bool(args.patch):
        print("kvmatrix pr: give --head REF or --patch FILE (one of them)", file=sys.stderr)
        return USAGE
    folder = args.folder or RUNS_DIR / f"pr-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        outcome = run_pr(args.repo, args.base, args.head, args.patch, args.records, Path(folder), _say,
                         base_ref=args.base_ref, cache_dir=Path(args.cache_dir), select_only=args.select_only)
    except PrError as err:
        print(f"kvmatrix pr: {err}", file=sys.stderr)
        return USAGE
    print(outcome.report, end="")
    return FAILED if outcome.new_failures else OK
