"""`kvmatrix pipeline`: the Buildkite and GitHub Actions files written (or checked) from the pool and cases. In
kvmatrix's checkout, of its own cases, the project's CI (`make matrix`); for a folder of one's own cases, or from an
installed kvmatrix, CI for the repository it runs in: jobs that install kvmatrix and run
`kvmatrix run --cases-dir <the folder>`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kvmatrix.harness import pipelines
from kvmatrix.harness.cli.exit_codes import FAILED, OK
from kvmatrix.harness.cli.version import kvmatrix_version
from kvmatrix.harness.record.paths import CHECKOUT
from kvmatrix.matrix.load import CASES_DIR, case_files


def add_arguments(pipe: argparse.ArgumentParser) -> None:
    pipe.add_argument("--cases-dir", default=str(CASES_DIR),
                      help="the folder of case files the CI runs (default: the built-in cases)")
    pipe.add_argument("--out-dir", help="the repository root the files go under, and --cases-dir is relative to "
                                        "in them (default: kvmatrix's checkout for its own cases, else here)")
    pipe.add_argument("--install", metavar="SPEC",
                      help="what the CI jobs pip-install as kvmatrix: a version, a wheel's URL or path, "
                           "`kvmatrix @ git+https://...` (default: kvmatrix==<this version>)")
    pipe.add_argument("--check", action="store_true", help="only check that the files are up to date")
    pipe.set_defaults(func=cmd_pipeline)


def users_pipeline(args: argparse.Namespace) -> tuple[Path, pipelines.Installed | None]:
    """(where the files go, None for the project's own CI or what a user's CI installs and runs)."""
    own_cases = Path(args.cases_dir).resolve() == CASES_DIR.resolve()
    if CHECKOUT and own_cases and not args.install and args.out_dir in (None, str(CHECKOUT)):
        return CHECKOUT, None
    root = Path(args.out_dir or ".")
    case_files(Path(args.cases_dir))  # a folder that is not there is an error naming it, before any file is written
    cases = os.path.relpath(Path(args.cases_dir).resolve(), root.resolve())
    if cases.startswith(".."):
        raise pipelines.PipelineError(f"--cases-dir {args.cases_dir} is not inside {root.resolve()}: CI checks out "
                                      f"the repository, so the cases must be in it (name its root with --out-dir)")
    spec = args.install or f"kvmatrix=={kvmatrix_version().split()[0]}"
    return root, pipelines.Installed(spec, cases)


def cmd_pipeline(args: argparse.Namespace) -> int:
    root, user = users_pipeline(args)
    stale = []
    for path, text in pipelines.generated(Path(args.cases_dir), user, root).items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    again = "make pipeline" if user is None else f"kvmatrix pipeline --cases-dir {user.cases}"
    for path in stale:
        print(f"kvmatrix: {path} is out of date: run `{again}`", file=sys.stderr)
    return FAILED if stale else OK
