"""Resuming a run: the records a run folder already holds are kept, their tasks not run again. Each is put under
today's waivers by the judge's own waiver stage (judge/waivers.py `waive`: a waiver added, changed or expired since
the record was written), and written back only where that changed it, so that the history, diffs and reports read
what the report shows. The runner writes every record a run has; no front end rewrites one."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence

from kvmatrix.harness.judge.waivers import Waiver, waive
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord

OnRecord = Callable[[JudgedRecord, int, int, bool], None]  # (record, done, total, resumed): a progress line


def finished_records(tasks: list[Task], run_dir: RunDir, waivers: Sequence[Waiver],
                     on_record: OnRecord | None = None, today: datetime.date | None = None
                     ) -> tuple[dict[str, JudgedRecord], list[Task]]:
    """(the records already in the run folder by task key, under the waivers as of `today`, the run's date; the
    tasks still to run)."""
    records: dict[str, JudgedRecord] = {}
    todo = []
    for task in tasks:
        existing = run_dir.read(task.cell.cell_id, task.gpu_name)
        if existing is None:
            todo.append(task)
            continue
        waived, _ = waive(existing, waivers, today)  # a "removable" waiver is reported over the whole run
        if waived != existing:
            run_dir.write(waived)
        records[task.key] = waived
        if on_record:
            on_record(waived, len(records), len(tasks), True)
    return records, todo
