"""A stored run judged again (`kvmatrix rejudge`): each record of a known cell and class that ran is judged under
the current case files, signature table and waivers, against its neighbours as the folder holds them, and written
back in place. Written here, beside the runner that wrote it first: no command writes a record file itself."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.known_failures import known_failures_for
from kvmatrix.harness.judge.outcome import reclassified
from kvmatrix.harness.judge.waivers import Waiver
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.neighbours import neighbours_of
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.schema import GpuClass


def rejudge_run(run_dir: RunDir, cells: Mapping[str, Cell], pool: Mapping[str, GpuClass],
                waivers: Sequence[Waiver], today: datetime.date | None = None) -> list[JudgedRecord]:
    """Every record of a run folder, those of a known cell and class that ran judged again and written back in
    place (the others as stored, a file that could not be read as its error). `today` decides which waivers have
    expired (default: the date now). What kvmatrix knows fails is read here, once, for the cells of a user's case."""
    today = today or datetime.date.today()
    known = known_failures_for(cells.values())
    records = []
    for record in run_dir.records():
        cell, gpu = cells.get(record["cell_id"]), record.get("gpu_class", "")
        if cell is not None and gpu in pool and record.get("status") != "skipped" and not record.get(
                "unreadable_record"):
            task = Task(cell, gpu, pool[gpu], record.get("emulated_from"))
            record = judge_record(reclassified(record, run_dir.log_tail(record)), task,
                                  neighbours_of(task, run_dir), waivers, today, known)
            run_dir.write(record)
        records.append(record)
    return records
