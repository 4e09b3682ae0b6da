"""kvmatrix: the one import name of the harness. Its parts live in the repository's own top-level folders
(matrix/, harness/, reports/ and the default cases/), which are `kvmatrix.matrix`, `kvmatrix.harness`,
`kvmatrix.reports` and `kvmatrix.cases`:

- installed from the wheel, those folders sit inside this package (pyproject's package-dir mapping), and nothing
  here is needed;
- in a checkout (PYTHONPATH at the repository, as the Makefile runs it, or an editable install), this package's
  folder holds only this file, so the repository root joins the package's search path: `kvmatrix.harness` is then
  the checkout's harness/ itself, at the same file paths as before, with no copy or link to keep in step.
"""

from __future__ import annotations

from pathlib import Path

_checkout = Path(__file__).resolve().parent.parent
if not (Path(__file__).parent / "harness").is_dir() and (_checkout / "harness" / "__init__.py").is_file():
    __path__.append(str(_checkout))
