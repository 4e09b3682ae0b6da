"""The records a cell's judgement compares it with, read in one place: its accuracy baseline, its differential
oracle, its model reference, and a draft cell's no-draft twin and plain twin (matrix/expand.py pairs them). The
judge reads no file: whoever knows the run folder (the runner after the cell, `kvmatrix rejudge`, `audit`,
`qualify` from a stored run) reads them here and passes them in. Each is the neighbour's judged record, or None
where the run folder has none (not run yet, selected out, unreadable) or the cell has no such neighbour."""

from __future__ import annotations

from dataclasses import dataclass

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord


@dataclass(frozen=True)
class Neighbours:
    baseline: JudgedRecord | None = None  # the accuracy baseline (Cell.baseline_id), never the cell itself
    oracle: JudgedRecord | None = None  # the differential oracle on the task's class (Cell.oracle_on)
    reference: JudgedRecord | None = None  # the model reference on the task's class (Cell.reference_on)
    draft_twin: JudgedRecord | None = None  # a draft cell's no-draft twin (Cell.draft_twin): greedy equality
    plain_twin: JudgedRecord | None = None  # a draft cell's plain twin (Cell.plain_twin_on): acceptance


def neighbours_of(task: Task, run_dir: RunDir) -> Neighbours:
    """The task's neighbours as the run folder holds them now."""
    cell, gpu = task.cell, task.gpu_name

    def read(cell_id: str | None) -> JudgedRecord | None:
        return run_dir.read(cell_id, gpu) if cell_id is not None and cell_id != cell.cell_id else None

    return Neighbours(baseline=read(cell.baseline_id), oracle=read(cell.oracle_on(gpu)),
                      reference=read(cell.reference_on(gpu)),
                      draft_twin=read(cell.draft_twin), plain_twin=read(cell.plain_twin_on(gpu)))
