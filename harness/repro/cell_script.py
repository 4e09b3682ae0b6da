"""A cell to its standalone script, the work behind `kvmatrix repro` (its arguments are harness/cli/repro.py's):
the cell found in the cases, the GPU class it is written for, its record in a run folder, and the script it gets:
the smallest one that shows what the cell is about (harness/repro/minimal.py, script.py) with an issue draft
(issue.py), or the script of every expectation of the cell on its exact checkpoint (generate.py)."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.repro import issue, script
from kvmatrix.harness.repro.generate import NeedsFullScript, ReproError, render, script_spec
from kvmatrix.harness.repro.minimal import minimal_spec
from kvmatrix.harness.run.session import this_device
from kvmatrix.harness.vllm_compat import installed_vllm_version
from kvmatrix.matrix.expand import Cell, expand_case
from kvmatrix.matrix.load import case_files, cases_option, load_case, load_models, load_pool
from kvmatrix.matrix.machine import class_of


@dataclass(frozen=True)
class ScriptRequest:
    """What a script is asked to be (`kvmatrix repro`'s options): `out_name` is its file's name, `observe` and
    `weights` choose what the minimal script asserts on and whether it writes a checkpoint (None: the cell's own
    choice), `finding` links the issue draft; `full` or `hub` ask for the full script."""

    cache_dir: Path
    out_name: str
    observe: str | None = None
    weights: bool | None = None
    finding: str | None = None
    full: bool = False
    hub: bool = False


def find_cell(cases_dir: Path, cell_id: str) -> tuple[Cell, dict, dict]:
    """The cell of that id, with the models and pool of its cases folder."""
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


def gpu_class_of(gpu: str | None, run: str | None, cell_id: str, pool: dict) -> str:
    """`gpu`, else the class the cell's record in the run folder ran as, else this machine's class."""
    if gpu:
        return gpu
    if run:
        classes = [r["gpu_class"] for r in RunDir(Path(run)).records() if r["cell_id"] == cell_id]
        if len(classes) != 1:
            raise ReproError(f"{run} holds {len(classes)} records of {cell_id}: name the class with --gpu")
        return classes[0]
    local = class_of(this_device(), pool)
    if local is None:
        raise ReproError("this machine is in no class of the pool: name one with --gpu")
    return local


def record_of(run: str | None, cell_id: str, gpu_name: str) -> JudgedRecord | None:
    """The cell's record in the run folder on that class, if there is one: what it failed on decides the
    observation."""
    return RunDir(Path(run)).read(cell_id, gpu_name) if run else None


def script_for(task: Task, models: dict, request: ScriptRequest, record: JudgedRecord | None, native: str | None,
               cases_dir: Path) -> tuple[str, str | None]:
    """(the script, its issue draft): the minimal one, else (asked for, or a cell it cannot show) the full one."""
    if not (request.full or request.hub):
        try:
            spec = minimal_spec(task, models, request.cache_dir, installed_vllm_version(), request.observe,
                                request.weights, record, emulate=task.gpu_name != native)
            text = script.render(spec)
            return text, issue.render(spec, text, script.expected_text(spec), record, link=request.finding)
        except NeedsFullScript as err:
            print(f"kvmatrix: {err}: writing the full script", file=sys.stderr)
    spec = script_spec(task, models, request.cache_dir, request.hub, installed_vllm_version())
    hub = ["--hub"] if request.hub else []
    command = "kvmatrix repro " + shlex.join([task.cell.cell_id, *cases_option(cases_dir), "--gpu", task.gpu_name,
                                               *hub, "--full", "--out", request.out_name])
    return render(spec, command), None
