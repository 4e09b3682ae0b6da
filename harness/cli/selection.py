"""Which cells a command works on: `--case`, `-k` and `--cell` as a selection of a folder's cells
(harness/run/cases.py loads and selects them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvmatrix.harness.run.cases import CaseSelection, select_cells
from kvmatrix.matrix.expand import MAX_CELLS, Cell
from kvmatrix.matrix.schema import CaseError


def add_selection_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases-dir", help="folder of case files (default: the one the run folder was made with, "
                                       "else the built-in cases)")
    p.add_argument("--case", action="append", help="only this case (file stem); repeatable")
    p.add_argument("-k", help="only cells whose id contains this, or this exact cell id; * and ? are "
                              "wildcards, [ and ] literal")
    p.add_argument("--cell", action="append", help="only this exact cell id; repeatable")
    p.add_argument("--max-cells", type=int, default=MAX_CELLS,
                   help=f"refuse case files that would take the matrix past this many cells (default {MAX_CELLS:,}; "
                        "0: no cap)")


def selection_of(args: argparse.Namespace) -> CaseSelection:
    """The selection options of a command's arguments."""
    return CaseSelection(tuple(args.case or ()), args.k, tuple(args.cell or ()),
                         getattr(args, "max_cells", MAX_CELLS))


def load_cells(args: argparse.Namespace, tolerant: bool = False, of_installed_vllm: bool = True
               ) -> tuple[list[Cell], list[CaseError], list[Cell]]:
    """(selected cells, case files set aside, every cell of the matrix) of `args.cases_dir` (select_cells)."""
    return select_cells(Path(args.cases_dir), selection_of(args), tolerant, of_installed_vllm)
