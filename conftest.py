"""`pytest cases/` in this checkout: the kvmatrix pytest plugin (harness/cli/pytest_plugin.py; registered by its
entry point wherever kvmatrix is installed, and here by name for a checkout on PYTHONPATH) over the built-in cases:
`pytest cases/ -k ct-llama` runs those cells as `kvmatrix run` does (warm workers, the same verdicts, reports and
findings in a new run folder), `-n 2` spreads them over xdist workers; `--kvmatrix-cases DIR` runs another folder's.

The harness's own tests live in tests/ and collect no cells.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["kvmatrix.harness.cli.pytest_plugin"]


def pytest_configure(config: pytest.Config) -> None:
    from kvmatrix.matrix.load import CASES_DIR

    config.kvmatrix_default_cases = CASES_DIR  # type: ignore[attr-defined]
