"""The records of run folders that commands read, and each one that could not be read said. What a run shows and
writes (its progress lines, reports and findings pages) is harness/finish.py's, shared with the pytest plugin."""

from __future__ import annotations

import sys
from pathlib import Path

from kvmatrix.harness.record.files import RunDir, unreadable
from kvmatrix.harness.record.types import JudgedRecord


def records_in(folders: list[str]) -> list[JudgedRecord]:
    """Every record of these run folders, in folder order."""
    return [r for folder in folders for r in RunDir(Path(folder)).records()]


def said_unreadable(records: list[JudgedRecord]) -> bool:
    """Each record file that could not be read, said on stderr (the reports show it as an error too); whether there
    was one: the command then exits non-zero, as a run with an error does."""
    lost = unreadable(records)
    for record in lost:
        print(f"kvmatrix: {record['reason']}", file=sys.stderr)
    return bool(lost)
