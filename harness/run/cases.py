"""Which cells a run works on: a folder's case files expanded, then a selection (`--case`, `-k`, `--cell`)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from kvmatrix.harness.run.session import vllm_vocabulary
from kvmatrix.matrix.expand import MAX_CELLS, Cell, expand_case
from kvmatrix.matrix.load import case_files, load_case, load_models, load_pool
from kvmatrix.matrix.patterns import glob_fullmatch
from kvmatrix.matrix.schema import CaseError


class SelectionError(ValueError):
    """--case, -k or --cell selected no cell: a typo would otherwise give an empty report and exit 0."""


@dataclass(frozen=True)
class CaseSelection:
    """The cells asked for: of these cases (file stems), whose id matches `k`, of these exact ids (each empty or
    None: all); case files that would take the matrix past `max_cells` are refused (0: no cap)."""

    cases: tuple[str, ...] = ()
    k: str | None = None
    cells: tuple[str, ...] = ()
    max_cells: int = MAX_CELLS


def select_cells(cases_dir: Path, selection: CaseSelection, tolerant: bool = False, of_installed_vllm: bool = True
                 ) -> tuple[list[Cell], list[CaseError], list[Cell]]:
    """(selected cells, case files set aside, every cell of the matrix). With `tolerant`, a case file that fails
    to load or expand is set aside as an error (the other cases still run); otherwise it stops the command. A
    selection that matches no cell raises SelectionError naming it. `of_installed_vllm=False` does not hold the
    cases to the installed vLLM's names (KV dtypes, engine arguments): judging records another release made, from
    cases generated for it, runs no vLLM here."""
    files = case_files(cases_dir)
    models, pool = load_models(cases_dir), load_pool(cases_dir)
    vocabulary = vllm_vocabulary(models) if of_installed_vllm else None
    cells: list[Cell] = []
    errors: list[CaseError] = []
    cap = selection.max_cells or None
    for path in files:
        left = None if cap is None else cap - len(cells)  # a case that would pass the cap is set aside unexpanded
        try:
            cells.extend(expand_case(load_case(path, vocabulary, left), models, pool, str(path), left))
        except CaseError as err:
            if not tolerant:
                raise
            errors.append(err)
    every = cells
    if selection.cases:
        cells = [c for c in cells if c.case.name in selection.cases]
        errors = [e for e in errors if e.case in selection.cases]
    if selection.k:
        cells = [c for c in cells if cell_selected(c.cell_id, selection.k)]
    if selection.cells:
        cells = [c for c in cells if c.cell_id in selection.cells]
    if not cells and not errors:
        raise SelectionError(f"no cell of {cases_dir} matches {_said(selection)} (`kvmatrix list` shows the ids)")
    return cells, errors, every


def _said(selection: CaseSelection) -> str:
    said = [("--case", c) for c in selection.cases] + ([("-k", selection.k)] if selection.k else [])
    said += [("--cell", c) for c in selection.cells]
    return " ".join(f"{flag} {shlex.quote(value)}" for flag, value in said) or "(everything: it has no case files)"


def cell_selected(cell_id: str, pattern: str) -> bool:
    """-k: a whole cell id (`name[...]`) matches only that cell, an id fragment every cell containing it; `*` and
    `?` are wildcards, `[` and `]` literal (as in the waivers file), so an id from `kvmatrix list` selects itself."""
    whole_id = "[" in pattern and pattern.endswith("]")
    if whole_id or set("*?") & set(pattern):
        return glob_fullmatch(pattern, cell_id)
    return pattern in cell_id
