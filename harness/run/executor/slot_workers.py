"""A slot's way of running cells: its warm workers (`SlotWorkers`: which case environments each slot's live workers
hold, so a cell goes where its worker already is), the launcher it runs cells with, and how the run's processes
start (forked from a template, or by exec)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.run.process.launch import WORKERS_PER_SLOT, FreshProcess, Launcher, WarmWorker
from kvmatrix.harness.run.process.start import Exec, ProcessStart
from kvmatrix.harness.run.process.template_client import Templates, remove_stale_socket_folders
from kvmatrix.harness.run.settings import RunSettings


def case_env(task: Task) -> tuple:
    """A case's own environment (`env:`), as slots tell their workers apart; () for the run's."""
    return tuple(sorted(task.cell.case.env.items()))


@dataclass
class SlotWorkers:
    """The case environments (a case's `env:`) of each slot's live warm workers, least recent first, as the
    records tell them; a cell goes to a free slot with a worker for its environment, if there is one: another slot
    would start a worker (imports and a first engine again, 20-30 s on a busy H200). Only a cell that ran in its
    slot's worker and left it running counts (on a cold H200, slots that had run only fresh-process confirmations
    were taken for workers they did not have: two cells at the end of the run each paid a worker's start)."""

    keep: int = WORKERS_PER_SLOT
    envs: dict[int, list[tuple]] = field(default_factory=dict)

    def pick(self, free_slots: list[int], case_env: tuple) -> int:
        return next((s for s in free_slots if case_env in self.envs.get(s, ())), free_slots[-1])

    def ran(self, slot: int, case_env: tuple, record: JudgedRecord) -> None:
        if record.get("isolation") != "worker":  # a fresh process: the slot's workers are as they were
            return
        worker = record.get("worker") or {}
        # A worker that died or ran out of time in the cell answered nothing (no teardown); a retired one ended.
        kept = "teardown_s" in worker and not worker.get("retired")
        envs = [e for e in self.envs.get(slot, []) if e != case_env] + ([case_env] if kept else [])
        self.envs[slot] = envs[-self.keep:]


def slot_launcher(settings: RunSettings, start: ProcessStart) -> Launcher:
    """A slot's way of running cells: its warm worker, or a fresh process per cell."""
    if settings.isolation == "worker" and not settings.fresh_caches:  # a worker's caches are its first cell's
        return WarmWorker(settings.worker_command, settings.run_dir.root / "logs" / "workers", start)
    return FreshProcess(settings.cell_command, start)


def process_start(settings: RunSettings) -> ProcessStart:
    """How the run's cell processes and workers start: forked from a template, or each running its command. Cells
    with caches of their own would each need a template of their own (the cache folders are fixed at import). Every
    run first removes the templates' socket folders that runners killed earlier left behind."""
    remove_stale_socket_folders()
    if settings.fork_from_template and not settings.fresh_caches:
        return Templates(settings.template_command, settings.run_dir.root / "logs" / "templates")
    return Exec()
