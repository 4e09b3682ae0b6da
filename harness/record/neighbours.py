"""The records a cell's judgement compares it with, named in one place (`neighbour_ids`) and read in one place
(`neighbours_of`): its accuracy baseline, its differential oracle, and a draft cell's no-draft twin and plain twin
(matrix/expand.py pairs them). Every executor ships and every reader reads exactly these: the local executor's
cells read them from the run folder, the Ray executor sends them to the node with the cell
(harness/run/executor/ray.py), the start order runs them first (harness/run/order/baselines.py). The judge reads no
file: whoever knows the run folder (the runner after the cell, `kvmatrix rejudge`, `audit`, `qualify` from a stored
run) reads them here and passes them in. Each is the neighbour's judged record, or None where the run folder has
none (not run yet, selected out, unreadable) or the cell has no such neighbour; a check that needs a neighbour the
run lacks says so in the record's rows, never passes silently."""

from __future__ import annotations

from dataclasses import dataclass

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.matrix.expand import Cell


@dataclass(frozen=True)
class Neighbours:
    """One field a role: `neighbour_ids` names each role's cell, a new kind of neighbour is a field here and a
    line there."""

    baseline: JudgedRecord | None = None  # the accuracy baseline (Cell.baseline_id), never the cell itself
    oracle: JudgedRecord | None = None  # the differential oracle on the task's class (Cell.oracle_on)
    draft_twin: JudgedRecord | None = None  # a draft cell's no-draft twin (Cell.draft_twin): greedy equality
    plain_twin: JudgedRecord | None = None  # a draft cell's plain twin (Cell.plain_twin_on): acceptance



def neighbour_ids(cell: Cell, gpu_name: str) -> dict[str, str]:
    """{role: cell id} of every cell this one's judgement on that class needs, each run (and shipped) before it;
    the cell itself is never its own neighbour."""
    ids = {"baseline": cell.baseline_id, "oracle": cell.oracle_on(gpu_name), "draft_twin": cell.draft_twin,
           "plain_twin": cell.plain_twin_on(gpu_name)}
    # Another kind of neighbour (a per-model reference cell, say) is one entry here and a field of Neighbours of
    # the same name: both executors then ship it and the start order runs it first.
    return {role: cell_id for role, cell_id in ids.items() if cell_id is not None and cell_id != cell.cell_id}


def neighbours_of(task: Task, run_dir: RunDir) -> Neighbours:
    """The task's neighbours as the run folder holds them now."""
    return Neighbours(**{role: run_dir.read(cell_id, task.gpu_name)
                         for role, cell_id in neighbour_ids(task.cell, task.gpu_name).items()})
