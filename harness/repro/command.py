"""`kvmatrix repro CELL [--run RUN_DIR] [--gpu CLASS] --out FILE.py`: the smallest standalone script that shows what
the cell is about (harness/repro/minimal.py, script.py) and an issue draft beside it (FILE.issue.md); `--full`
writes the script of every expectation of the cell on its exact checkpoint instead (generate.py)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.model import JudgedRecord
from kvmatrix.harness.record.paths import DEFAULT_CACHE
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.repro import issue, script
from kvmatrix.harness.repro.generate import NeedsFullScript, ReproError, render, script_spec
from kvmatrix.harness.repro.minimal import OBSERVATIONS, minimal_spec
from kvmatrix.harness.run.guards import cases_dir_for
from kvmatrix.harness.run.session import this_device
from kvmatrix.harness.vllm_compat import installed_vllm_version
from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.load import case_files, cases_option, load_case, load_models, load_pool
from kvmatrix.matrix.machine import class_of


def find_cell(cases_dir: Path, cell_id: str):
    models, pool = load_models(cases_dir), load_pool(cases_dir)
    case_name = cell_id.split("[", 1)[0]
    for path in case_files(cases_dir):
        if path.stem == case_name:
            cells = expand_case(load_case(path), models, pool, str(path))
            found = [c for c in cells if c.cell_id == cell_id]
            if found:
                return found[0], models, pool
            raise ReproError(f"case {case_name!r} has no cell {cell_id!r}; its cells: "
                             + ", ".join(c.cell_id for c in cells))
    raise ReproError(f"no case file {case_name!r} in {cases_dir}")


def gpu_class_of(args: argparse.Namespace, cell_id: str, pool: dict) -> str:
    """--gpu, else the class the cell's record in --run ran as, else this machine's class."""
    if args.gpu:
        return args.gpu
    if args.run:
        classes = [r["gpu_class"] for r in RunDir(Path(args.run)).records() if r["cell_id"] == cell_id]
        if len(classes) != 1:
            raise ReproError(f"{args.run} holds {len(classes)} records of {cell_id}: name the class with --gpu")
        return classes[0]
    local = class_of(this_device(), pool)
    if local is None:
        raise ReproError("this machine is in no class of the pool: name one with --gpu")
    return local


def record_of(args: argparse.Namespace, cell_id: str, gpu_name: str) -> JudgedRecord | None:
    """The cell's record in --run on that class, if there is one: what it failed on decides the observation."""
    return RunDir(Path(args.run)).read(cell_id, gpu_name) if args.run else None


def cmd_repro(args: argparse.Namespace) -> int:
    try:
        cases_dir = cases_dir_for(args.cases_dir, args.run)
        cell, models, pool = find_cell(cases_dir, args.cell_id)
        gpu_name = gpu_class_of(args, cell.cell_id, pool)
        if gpu_name not in pool:
            raise ReproError(f"GPU class {gpu_name!r} is not in the pool; known: {', '.join(pool)}")
        task = Task(cell, gpu_name, pool[gpu_name])
        record = record_of(args, cell.cell_id, gpu_name)
        native = class_of(this_device(), pool)  # a script for this machine's own class need not emulate it
        text, draft = write(task, models, args, record, native, cases_dir)
    except ReproError as err:
        print(f"kvmatrix: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if draft is not None:
        out.with_suffix(".issue.md").write_text(draft)
        print(f"wrote {out.with_suffix('.issue.md')}: an issue draft in the shape of vLLM's bug report")
    print(f"wrote {out}: run it with `python {out}` (exit status 0: the expectation holds)")
    return 0


def write(task: Task, models: dict, args: argparse.Namespace, record: JudgedRecord | None, native: str | None,
          cases_dir: Path) -> tuple[str, str | None]:
    """(the script, its issue draft): the minimal one, else (asked for, or a cell it cannot show) the full one."""
    if not (args.full or args.hub):
        try:
            spec = minimal_spec(task, models, Path(args.cache_dir), installed_vllm_version(), args.observe,
                                args.weights, record, emulate=task.gpu_name != native)
            text = script.render(spec)
            return text, issue.render(spec, text, script.expected_text(spec), record, link=args.finding)
        except NeedsFullScript as err:
            print(f"kvmatrix: {err}: writing the full script", file=sys.stderr)
    spec = script_spec(task, models, Path(args.cache_dir), args.hub, installed_vllm_version())
    hub = ["--hub"] if args.hub else []
    command = "kvmatrix repro " + shlex.join([task.cell.cell_id, *cases_option(cases_dir), "--gpu", task.gpu_name,
                                               *hub, "--full", "--out", Path(args.out).name])
    return render(spec, command), None


def add_arguments(rep: argparse.ArgumentParser) -> None:
    """`kvmatrix repro`'s arguments (harness/cli/commands.py lists the command)."""
    rep.add_argument("cell_id", metavar="CELL", help="exact cell id, e.g. 'ct-llama[kv=bfloat16,skip=-,spec=-]'")
    rep.add_argument("--run", help="run folder whose record of the cell names the GPU class")
    rep.add_argument("--gpu", help="GPU class whose decisions the script takes (default: --run's, else this machine's)")
    rep.add_argument("--out", required=True, help="the script to write (its model is written next to it)")
    rep.add_argument("--observe", choices=OBSERVATIONS,
                     help="what the script asserts on: runs (starts and generates, or refuses as the case accepts), "
                          "layers (the layers' resolved KV dtypes / pages), tokens (against the eager oracle); "
                          "default: what --run's record failed on, else the cell's strongest check")
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
