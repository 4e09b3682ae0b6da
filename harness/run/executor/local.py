"""This machine's executor (`LocalExecutor`, `run_locally`): its slots run the cells in the start order the run's
plan holds (harness/run/order/), each in its slot's warm worker or a fresh process (slot_workers.py), the canary
first and the others beside it, a free slot taking the next ready cell (dispatch.py); cells spanning several GPUs
last, on whole GPUs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from kvmatrix.harness.judge.facts import facts
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.run.activity import Activity
from kvmatrix.harness.run.executor.dispatch import run_gated, run_on_whole_gpus
from kvmatrix.harness.run.executor.slot_workers import SlotWorkers, case_env, process_start, slot_launcher
from kvmatrix.harness.run.host.gpu_memory import gpu_baselines
from kvmatrix.harness.run.last_run import last_run_file, remember
from kvmatrix.harness.run.model_builds import TrainingAhead, trainings_waited_on
from kvmatrix.harness.run.order.canary import EnvironmentBroken, canary_failure
from kvmatrix.harness.run.order.pilots import kernel_family, mark_warm
from kvmatrix.harness.run.order.policy import PastRuns, StartOrder
from kvmatrix.harness.run.order.start_order import planned_order
from kvmatrix.harness.run.process.env import run_mark
from kvmatrix.harness.run.process.gpu_check import pinned_gpus
from kvmatrix.harness.run.process.groups import CellProcesses
from kvmatrix.harness.run.process.launch import FreshProcess
from kvmatrix.harness.run.resume import OnRecord, finished_records
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.confirmations import Confirmations
from kvmatrix.harness.run.task.runner import judged_record, unwritable_record
from kvmatrix.harness.run.task.skips import not_run_reason


@dataclass(frozen=True)
class LocalExecutor:
    """This machine's slots: `slots` cells at once, `slot_env(slot)` each slot's environment (e.g.
    CUDA_VISIBLE_DEVICES for its GPU); `devices`, this machine's GPUs a cell may span (such a cell takes whole
    ones, after the one-GPU cells), and `ranks_env(gpus)` what it sees of them. The cells start in the order given
    (a run plan's, harness/run/order/start_order.py); `activity`, if any, hears each cell that starts a process (the
    run's start lines and heartbeat)."""

    slots: int = 1
    slot_env: Callable[[int], dict[str, str]] | None = None
    devices: int = 0
    ranks_env: Callable[[list[int]], dict[str, str]] | None = None
    activity: Activity | None = None

    def run(self, tasks: list[Task], order: StartOrder, settings: RunSettings,
            on_record: OnRecord | None = None) -> list[JudgedRecord]:
        records, _ = finished_records(tasks, settings.run_dir, settings.waivers, on_record, settings.today)
        _LocalRun(self, settings, order.without(records.keys()), records, len(tasks), on_record).run()
        return [records[t.key] for t in tasks if t.key in records]


class _LocalRun:
    """One LocalExecutor.run: its slots, cell processes and records, shared by the threads that run its cells,
    started in the order given."""

    def __init__(self, executor: LocalExecutor, settings: RunSettings, order: StartOrder,
                 records: dict[str, JudgedRecord], total: int, on_record: OnRecord | None):
        self.executor, self.settings, self.order, self.records = executor, settings, order, records
        # In a warm run the first cell of a case expected not to pass confirms its failure in a fresh process.
        self.expected_failure = order.expected_failure
        self.built = dict(settings.built)  # the models this run builds as its cells start: its own, not the plan's
        self.total, self.on_record, self.jobs = total, on_record, max(1, executor.slots)
        # Before any cell starts: what the slots' GPUs hold that is not this run's.
        baselines = (gpu_baselines(settings.gpu_memory, pinned_gpus(executor.slot_env, self.jobs))
                     if settings.gpu_memory is not None else None)
        self.processes = CellProcesses(baselines, run_mark=run_mark(settings))
        self.warm = settings.isolation == "worker"
        self.confirmations = Confirmations()
        self.lock = threading.Lock()
        self.free_slots = list(range(self.jobs))
        self.start = process_start(settings)  # shared by the slots: one template serves them all
        self.launchers = [slot_launcher(settings, self.start) for _ in range(self.jobs)]
        self.fresh = FreshProcess(settings.cell_command, self.start)
        self.slot_workers = SlotWorkers()
        # The canary starts first, waiting for nothing; the other slots start beside it, and keep nothing before
        # it ran (so none may be a cell it waits for).
        self.canary = order.canary
        self.broken: list[str] = []  # why the canary says this environment cannot be judged
        self.canary_ran = threading.Event()

    def run(self) -> None:
        settings, order = self.settings, self.order
        todo = list(order.tasks)
        runnable = [] if settings.use_hub else [t for t in todo if not_run_reason(t, settings) is None]
        training = TrainingAhead(runnable, settings.models, settings.cache_dir / "models", self.built)
        try:
            run_gated(todo, order.waits, self.one, self.processes, self.jobs,
                      lambda task: trainings_waited_on(task, settings.models, self.built), training.busy,
                      self.waits_for_its_worker)
        finally:
            for launcher in self.launchers:
                launcher.close()
            self.start.close()
        if self.broken:
            raise EnvironmentBroken(self.broken[0])
        run_on_whole_gpus(list(order.wide), self.executor.devices, self.one_wide, self.processes)

    def keep(self, task: Task, record: JudgedRecord, stand_in: bool = False) -> None:
        """The task's record, written and counted; `stand_in`: an error the harness made up for a cell whose files
        it could not write, counted and shown but never written (a resume would keep it as the cell's result)."""
        try:
            if not stand_in:
                self.settings.run_dir.write(record)
        except OSError as err:  # a full disk: the run goes on; the reports show the cell, a resume runs it again
            record = unwritable_record(task, self.settings.run_dir.root.name, err, record)
        else:
            if not stand_in:
                remember(last_run_file(self.settings.cache_dir, task.gpu_name, self.settings.vllm_version), record)
        with self.lock:
            self.records[task.key] = record
            if self.on_record:
                self.on_record(record, len(self.records), self.total, False)

    def one(self, task: Task) -> None:
        """A one-GPU cell (or a CPU one) in a free slot, preferring a slot whose warm worker suits its case. Cells
        run beside the canary (each slot's first cell starts its worker meanwhile: on an H200 the imports and a
        first engine, 30-60 s, that seven slots spent idle while the canary ran alone), but a record is kept only
        once the canary ran: a canary that fails kills the cells beside it, and nothing of this environment is
        recorded, so the same run, once the environment is mended, starts with it again."""
        is_canary = self.canary is not None and task.key == self.canary.key
        stand_in = False
        try:
            if self.processes.stopping or self.broken:
                return
            try:
                record = self._in_slot(task)
            except OSError as err:  # the cell's files (spec, log) could not be written: this cell's error
                record, stand_in = unwritable_record(task, self.settings.run_dir.root.name, err), True
            if is_canary and not self.processes.stopping and (why := canary_failure(task, record)):
                self.broken.append(why)
                self.processes.kill_all()  # the cells beside it run in an environment that cannot be judged
        finally:
            if is_canary:
                self.canary_ran.set()
        if self.processes.stopping or self.broken or not self._canary_passed():
            return
        self.keep(task, record, stand_in)
        if self.jobs > 1 and record.get("status") == "ok":  # a skip or a crash compiled nothing, or not all
            mark_warm(self.settings, kernel_family(task, facts(record).get("backend")))

    def _canary_passed(self) -> bool:
        """Whether this environment may be recorded: no canary, or it ran and found nothing broken (waiting for it,
        unless the harness is stopping)."""
        if self.canary is None:
            return True
        while not self.canary_ran.wait(timeout=1.0):
            if self.processes.stopping:
                return False
        return not self.broken

    def waits_for_its_worker(self, task: Task, running: list[Task], pending: list[Task]) -> bool:
        """Whether a cell of a case with its own environment (`env:`) should let another cell go first: as many
        slots already run cells of that environment as its share of the cells left gives it. Such cells then run
        one after another in the slots that have their workers (SlotWorkers.pick) instead of starting a worker in
        every slot (on a cold H200, glm5-fp8's cells started a second worker, imports and a first engine, in up to
        eight slots), and still take the slots the others leave at the end."""
        env = case_env(task)
        if not env or not self.warm:
            return False
        left = running + pending
        share = -(-self.jobs * sum(case_env(t) == env for t in left) // len(left))
        return sum(case_env(t) == env for t in running) >= share

    def _in_slot(self, task: Task) -> JudgedRecord:
        env = case_env(task)
        with self.lock:
            slot = self.slot_workers.pick(self.free_slots, env)
            self.free_slots.remove(slot)
        record = None
        try:
            slot_env = self.executor.slot_env(slot) if self.executor.slot_env else None
            expected_failure = self.expected_failure.get(task.key) if self.warm else None
            with self.watched(task):
                record = judged_record(task, self.settings, self.processes, slot_env, self.launchers[slot],
                                       expected_failure, self.confirmations, self.fresh, self.built)
        finally:
            with self.lock:
                if record is not None:
                    self.slot_workers.ran(slot, env, record)
                self.free_slots.append(slot)
        return record

    def watched(self, task: Task) -> AbstractContextManager[None]:
        """The task said as running while it runs, unless it is a skip (nothing starts)."""
        activity = self.executor.activity
        if activity is None or not_run_reason(task, self.settings) is not None:
            return nullcontext()
        return activity.running(task)

    def one_wide(self, task: Task, gpus: list[int]) -> None:
        ranks_env = self.executor.ranks_env
        env = ranks_env(gpus) if ranks_env else {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
        # A fresh process each: the ranks are the engine's own processes, nothing a slot's worker could keep.
        stand_in = False
        try:
            with self.watched(task):
                record = judged_record(task, self.settings, self.processes, env, built=self.built)
        except OSError as err:
            record, stand_in = unwritable_record(task, self.settings.run_dir.root.name, err), True
        if not self.processes.stopping:
            self.keep(task, record, stand_in)


def run_locally(tasks: list[Task], settings: RunSettings, jobs: int = 1, on_record: OnRecord | None = None,
                slot_env: Callable[[int], dict[str, str]] | None = None, devices: int = 0,
                ranks_env: Callable[[list[int]], dict[str, str]] | None = None, past: PastRuns | None = None
                ) -> list[JudgedRecord]:
    """The tasks run on this machine's slots, `jobs` at once, in the order a plan would give them after runs that
    saw `past` (see `LocalExecutor` and `Executor.run`)."""
    finished = [r for t in tasks if (r := settings.run_dir.read(t.cell.cell_id, t.gpu_name)) is not None]
    order = planned_order(tasks, settings, jobs, devices, past or PastRuns(), finished)
    return LocalExecutor(jobs, slot_env, devices, ranks_env).run(tasks, order, settings, on_record)
