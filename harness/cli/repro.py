"""`kvmatrix repro CELL [--run RUN_DIR] [--gpu CLASS] --out FILE.py`: the smallest standalone script that shows what
the cell is about and an issue draft beside it (FILE.issue.md); `--full` writes the script of every expectation of
the cell on its exact checkpoint instead. Which script a cell gets is harness/repro/cell_script.py's; here its
arguments, the files written and its exit status."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvmatrix.harness.cli.exit_codes import OK, USAGE
from kvmatrix.harness.record.paths import DEFAULT_CACHE
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.repro.cell_script import ScriptRequest, find_cell, gpu_class_of, record_of, script_for
from kvmatrix.harness.repro.generate import ReproError
from kvmatrix.harness.repro.rules import OBSERVATIONS
from kvmatrix.harness.run.guards import cases_dir_for
from kvmatrix.harness.run.session import this_device
from kvmatrix.matrix.machine import class_of


def add_arguments(rep: argparse.ArgumentParser) -> None:
    rep.add_argument("cell_id", metavar="CELL", help="exact cell id, e.g. 'ct-llama[kv=bfloat16,skip=-,spec=-]'")
    rep.add_argument("--run", help="run folder whose record of the cell names the GPU class")
    rep.add_argument("--gpu", help="GPU class whose decisions the script takes (default: --run's, else this machine's)")
    rep.add_argument("--out", required=True, help="the script to write (its model is written next to it)")
    rep.add_argument("--observe", choices=OBSERVATIONS,
                     help="what the script asserts on: runs (starts and generates, or refuses as the case accepts), "
                          "crash (fails as the case's known failure), state (layers, KV groups, builders, pages as "
                          "the case's rules check them), tokens (against the eager oracle); default: what --run's "
                          "record failed on, else the cell's strongest check")
    rep.add_argument("--weights", action=argparse.BooleanOptionalAction, default=None,
                     help="write a seeded random checkpoint (default: only for tokens; else vLLM's dummy weights)")
    rep.add_argument("--finding", help="the findings entry's link, for the issue draft")
    rep.add_argument("--full", action="store_true",
                     help="the script of every expectation on the cell's exact checkpoint (long) instead")
    rep.add_argument("--hub", action="store_true",
                     help="name the registry's hub ids instead of tiny models (implies --full)")
    rep.add_argument("--cases-dir", help="folder of case files (default: --run's, else the built-in cases)")
    rep.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="built tiny models")
    rep.set_defaults(func=cmd_repro)


def request_of(args: argparse.Namespace) -> ScriptRequest:
    return ScriptRequest(Path(args.cache_dir), Path(args.out).name, observe=args.observe, weights=args.weights,
                         finding=args.finding, full=args.full, hub=args.hub)


def cmd_repro(args: argparse.Namespace) -> int:
    try:
        cases_dir = cases_dir_for(args.cases_dir, args.run)
        cell, models, pool = find_cell(cases_dir, args.cell_id)
        gpu_name = gpu_class_of(args.gpu, args.run, cell.cell_id, pool)
        if gpu_name not in pool:
            raise ReproError(f"GPU class {gpu_name!r} is not in the pool; known: {', '.join(pool)}")
        record = record_of(args.run, cell.cell_id, gpu_name)
        native = class_of(this_device(), pool)  # a script for this machine's own class need not emulate it
        text, draft = script_for(Task(cell, gpu_name, pool[gpu_name]), models, request_of(args), record, native,
                                 cases_dir)
    except ReproError as err:
        print(f"kvmatrix: {err}", file=sys.stderr)
        return USAGE
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if draft is not None:
        out.with_suffix(".issue.md").write_text(draft)
        print(f"wrote {out.with_suffix('.issue.md')}: an issue draft in the shape of vLLM's bug report")
    print(f"wrote {out}: run it with `python {out}` (exit status 0: the expectation holds)")
    return OK
