"""docs/guarantees.md backs each guarantee with tests: every test file and test it cites exists (two once did not)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "guarantees.md"


def cited() -> list[tuple[str, str | None]]:
    """(test file, test name or None) for each citation of the page's tables: `tests/x.py::name` and the `::name`
    citations after it in the same cell, which name tests of that file."""
    found = []
    for line in PAGE.read_text().splitlines():
        if not line.startswith("|"):
            continue
        current = None
        for token in re.findall(r"`([^`]+)`", line.rsplit("|", 2)[-2]):
            if token.startswith("tests/"):
                current, _, name = token.partition("::")
                found.append((current, name or None))
            elif token.startswith("::") and current:
                found.append((current, token[2:]))
    return found


def test_every_test_the_guarantees_cite_exists():
    citations = cited()
    assert len(citations) > 50
    missing = []
    for file, name in citations:
        path = REPO / file
        if not path.exists():
            missing.append(file)
            continue
        if name is None or path.suffix != ".py":
            continue
        defined = {node.name for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
        if name not in defined:
            missing.append(f"{file}::{name}")
    assert missing == []
