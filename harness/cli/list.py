"""`kvmatrix list`: the cells the cases expand to, each with the GPU classes it runs on (its case's skip rules and
what a class cannot run, under the installed vLLM, leave the others out), the cells kvmatrix adds to a case's own
(eager oracles, no-draft twins, baselines, model references) marked with why."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import OK
from kvmatrix.harness.cli.selection import add_selection_options, load_cells
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.guards import cases_dir_for
from kvmatrix.harness.run.task.skips import execution_reason
from kvmatrix.harness.vllm_compat import installed_vllm_version
from kvmatrix.matrix.expand import Cell, added_cells
from kvmatrix.matrix.load import load_pool
from kvmatrix.matrix.machine import PoolError
from kvmatrix.matrix.schema import GpuClass


def add_arguments(lst: argparse.ArgumentParser) -> None:
    add_selection_options(lst)
    lst.add_argument("--gpu", action="append", metavar="CLASS",
                     help="only the cells that run on this class; repeatable")
    lst.set_defaults(func=cmd_list)


def runs_on(cell: Cell, pool: dict[str, GpuClass], vllm_version: str | None) -> list[str]:
    """The classes a cell runs on: those its case names, less those its skip rules or its execution leave out."""
    return [gpu for gpu in cell.gpu_classes
            if not cell.skip_reason(cell.context(gpu, pool[gpu], vllm_version, False))
            and not execution_reason(Task(cell, gpu, pool[gpu]))]


# Why kvmatrix adds a case's model reference (matrix/expand.py `reference_axes`, harness/judge/reference.py).
REFERENCE = "model reference: the case's other plain cells are compared with it (an unquantized cache, eager, plain)"


def why_added(cell: Cell, classes: list[str], added: dict[str, str]) -> str:
    """Why kvmatrix adds this cell, on the classes it is listed for ("" where the case lists it): a model reference
    where it is one; the reference's combination runs compiled where a class has graphs, compared with its eager
    oracle, the reference there; else as matrix/expand.py `added_cells` says."""
    if cell.cell_id not in added:
        return ""
    where = [gpu for gpu in classes if gpu in cell.reference_for]
    compiled = "the model reference's combination run compiled, compared with its eager oracle, the reference there"
    if where and len(where) < len(classes):
        return f"{REFERENCE} on {', '.join(where)}; on the others {compiled}"
    return REFERENCE if where else compiled if cell.reference_for else added[cell.cell_id]


def cmd_list(args: argparse.Namespace) -> int:
    args.cases_dir = cases_dir_for(args.cases_dir)
    pool = load_pool(Path(args.cases_dir))
    unknown = [gpu for gpu in args.gpu or () if gpu not in pool]
    if unknown:
        raise PoolError(f"--gpu {unknown[0]}: no such class in the pool ({', '.join(pool)})")
    cells, _, _ = load_cells(args)
    added = added_cells(cells)
    version = installed_vllm_version()
    shown = nowhere = marked = 0
    for cell in cells:
        classes = runs_on(cell, pool, version)
        if args.gpu:
            classes = [gpu for gpu in classes if gpu in args.gpu]
            if not classes:
                continue
        shown += 1
        nowhere += not classes
        where = f"[{', '.join(classes)}]" if classes else "[skipped on every class]"
        why = f"  (added by kvmatrix, {reason})" if (reason := why_added(cell, classes, added)) else ""
        marked += bool(why)
        print(f"{cell.cell_id}  {where}{why}")
    on = f" on {', '.join(args.gpu)}" if args.gpu else ""
    print(f"{shown} cells{on}" + (f", {nowhere} skipped on every class" if nowhere else "")
          + (f"; {marked} of them added by kvmatrix to the cells the cases list (marked)" if marked else ""),
          file=sys.stderr)
    return OK
