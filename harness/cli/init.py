"""`kvmatrix init DIR`: a starter folder of one's own cases (harness/starter.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import OK
from kvmatrix.harness.starter import write_starter


def add_arguments(init: argparse.ArgumentParser) -> None:
    init.add_argument("folder")
    init.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    written = write_starter(Path(args.folder))
    for path in written:
        print(f"wrote {path}")
    print(f"next: kvmatrix list --cases-dir {args.folder}")
    return OK
