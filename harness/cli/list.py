"""`kvmatrix list`: the cells the cases expand to, with the GPU classes each runs on."""

from __future__ import annotations

import argparse
import sys

from kvmatrix.harness.cli.exit_codes import OK
from kvmatrix.harness.cli.selection import add_selection_options, load_cells
from kvmatrix.harness.run.guards import cases_dir_for


def add_arguments(lst: argparse.ArgumentParser) -> None:
    add_selection_options(lst)
    lst.set_defaults(func=cmd_list)


def cmd_list(args: argparse.Namespace) -> int:
    args.cases_dir = cases_dir_for(args.cases_dir)
    cells, _, _ = load_cells(args)
    for cell in cells:
        print(f"{cell.cell_id}  [{', '.join(cell.gpu_classes)}]")
    print(f"{len(cells)} cells", file=sys.stderr)
    return OK
