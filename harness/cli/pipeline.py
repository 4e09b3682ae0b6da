"""`kvmatrix pipeline`: the Buildkite and GitHub Actions files written (or checked) from the pool and cases."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import FAILED, OK
from kvmatrix.harness.nightly import pipelines
from kvmatrix.matrix.load import CASES_DIR


def add_arguments(pipe: argparse.ArgumentParser) -> None:
    pipe.add_argument("--cases-dir", default=str(CASES_DIR))
    pipe.add_argument("--check", action="store_true", help="only check that the files are up to date")
    pipe.set_defaults(func=cmd_pipeline)


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
    return FAILED if stale else OK
