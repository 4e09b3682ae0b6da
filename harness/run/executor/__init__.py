"""Executors run a plan's tasks to records, behind one `Executor` protocol: this machine's slots (local.py) or a
Ray cluster's nodes (ray.py). Both resume: a task whose record is already in the run folder is not run again (its
record kept under today's waivers, harness/run/resume.py); both start the cells in the order the run's plan holds,
its canary first; both write each record as its cell finishes, and return every record in task order."""

from __future__ import annotations

from typing import Protocol

from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.run.order.policy import StartOrder
from kvmatrix.harness.run.resume import OnRecord
from kvmatrix.harness.run.settings import RunSettings


class Executor(Protocol):
    def run(self, tasks: list[Task], order: StartOrder, settings: RunSettings,
            on_record: OnRecord | None = None) -> list[JudgedRecord]:
        """Every task not already recorded in the run folder, run as `order` (the run plan's start order) says:
        its canary first, each cell after what it waits for; all records, finished ones too, in task order.
        `on_record(record, done, total, resumed)` is called once per cell as it finishes (progress lines)."""
        ...
