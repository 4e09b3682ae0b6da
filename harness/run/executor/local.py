"""This machine's executor (`LocalExecutor`, `run_locally`): its slots run the cells in the start order
(harness/run/order/), each in its slot's warm worker or a fresh process, beside the canary; cells spanning several
GPUs last, on whole GPUs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace

from kvmatrix.harness.judge.facts import facts
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.run.activity import Activity
from kvmatrix.harness.run.host.gpu_memory import gpu_baselines
from kvmatrix.harness.run.last_run import last_run_file, remember
from kvmatrix.harness.run.model_builds import TrainingAhead, trainings_waited_on
from kvmatrix.harness.run.order.canary import EnvironmentBroken, canary_failure
from kvmatrix.harness.run.order.pilots import kernel_family, mark_warm
from kvmatrix.harness.run.order.policy import PastRuns, StartContext, StartOrder
from kvmatrix.harness.run.order.start_order import start_order
from kvmatrix.harness.run.process.env import run_mark
from kvmatrix.harness.run.process.gpu_check import pinned_gpus
from kvmatrix.harness.run.process.groups import CellProcesses
from kvmatrix.harness.run.process.launch import WORKERS_PER_SLOT, FreshProcess, Launcher, WarmWorker
from kvmatrix.harness.run.process.start import Exec, ProcessStart
from kvmatrix.harness.run.process.template_client import Templates, remove_stale_socket_folders
from kvmatrix.harness.run.resume import OnRecord, finished_records
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.confirmations import Confirmations
from kvmatrix.harness.run.task.runner import expected_not_to_pass, judged_record, unwritable_record
from kvmatrix.harness.run.task.skips import not_run_reason


@dataclass(frozen=True)
class LocalExecutor:
    """This machine's slots: `slots` cells at once, `slot_env(slot)` each slot's environment (e.g.
    CUDA_VISIBLE_DEVICES for its GPU); `devices`, this machine's GPUs a cell may span (such a cell takes whole
    ones, after the one-GPU cells), and `ranks_env(gpus)` what it sees of them. The cells start in the order of
    harness/run/order/start_order.py, given what the earlier runs saw (`past`); `activity`, if any, hears each
    cell that starts a process (the run's start lines and heartbeat)."""

    slots: int = 1
    slot_env: Callable[[int], dict[str, str]] | None = None
    devices: int = 0
    ranks_env: Callable[[list[int]], dict[str, str]] | None = None
    past: PastRuns = PastRuns()
    activity: Activity | None = None

    def run(self, tasks: list[Task], settings: RunSettings, on_record: OnRecord | None = None) -> list[JudgedRecord]:
        # The models this run builds as its cells start are its own: the settings it was given (a run plan's)
        # never change under their holder.
        settings = replace(settings, built=dict(settings.built))
        records, todo = finished_records(tasks, settings.run_dir, settings.waivers, on_record, settings.today)
        # Why each cell is expected not to pass (None: it is expected to). In a warm run the first such cell of
        # a case confirms its failure in a fresh process, its siblings wait and then stay in warm workers; in any
        # run such a cell is never a pilot.
        expected_failure = {t.key: expected_not_to_pass(t, settings, dict(self.past.verdicts)) for t in todo}
        context = StartContext(settings, expected_failure, max(1, self.slots), self.devices, self.past,
                               tuple(records.values()))
        _LocalRun(self, settings, start_order(todo, context), expected_failure, records, len(tasks), on_record).run()
        return [records[t.key] for t in tasks if t.key in records]


class _LocalRun:
    """One LocalExecutor.run: its slots, cell processes and records, shared by the threads that run its cells,
    started in the order given."""

    def __init__(self, executor: LocalExecutor, settings: RunSettings, order: StartOrder,
                 expected_failure: dict[str, str | None], records: dict[str, JudgedRecord], total: int,
                 on_record: OnRecord | None):
        self.executor, self.settings, self.order, self.records = executor, settings, order, records
        self.expected_failure = expected_failure
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
        training = TrainingAhead(runnable, settings.models, settings.cache_dir / "models", settings.built)
        try:
            _run_gated(todo, order.waits, self.one, self.processes, self.jobs,
                       lambda task: trainings_waited_on(task, settings.models, settings.built), training.busy,
                       self.waits_for_its_worker)
        finally:
            for launcher in self.launchers:
                launcher.close()
            self.start.close()
        if self.broken:
            raise EnvironmentBroken(self.broken[0])
        _run_on_whole_gpus(list(order.wide), self.executor.devices, self.one_wide, self.processes)

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
        case_env = _case_env(task)
        if not case_env or not self.warm:
            return False
        left = running + pending
        share = -(-self.jobs * sum(_case_env(t) == case_env for t in left) // len(left))
        return sum(_case_env(t) == case_env for t in running) >= share

    def _in_slot(self, task: Task) -> JudgedRecord:
        case_env = _case_env(task)
        with self.lock:
            slot = self.slot_workers.pick(self.free_slots, case_env)
            self.free_slots.remove(slot)
        record = None
        try:
            slot_env = self.executor.slot_env(slot) if self.executor.slot_env else None
            expected_failure = self.expected_failure[task.key] if self.warm else None
            with self.watched(task):
                record = judged_record(task, self.settings, self.processes, slot_env, self.launchers[slot],
                                       expected_failure, self.confirmations, self.fresh)
        finally:
            with self.lock:
                if record is not None:
                    self.slot_workers.ran(slot, case_env, record)
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
                record = judged_record(task, self.settings, self.processes, env)
        except OSError as err:
            record, stand_in = unwritable_record(task, self.settings.run_dir.root.name, err), True
        if not self.processes.stopping:
            self.keep(task, record, stand_in)


def _case_env(task: Task) -> tuple:
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


def _run_gated(tasks: list[Task], waits: Mapping[str, AbstractSet[str]], one: Callable[[Task], None],
               processes: CellProcesses, jobs: int, builds: Callable[[Task], set[str]] = lambda task: set(),
               building_ahead: Callable[[], set[str]] = set,
               waits_for_its_worker: Callable[[Task, list[Task], list[Task]], bool] = lambda *_: False) -> None:
    """`jobs` cells at a time, each free slot taking the first task in order whose `waits` (task keys: its
    baseline, its family's pilot) have all finished, passing over one that would wait for a long model build a
    running cell (or `building_ahead`, the run's own) is doing (`builds`: such builds a task does as it starts)
    or whose environment has its share of the slots already (`waits_for_its_worker`, given the running and the
    pending tasks) while another is ready; an interrupted harness kills every running cell first."""
    pending, finished = list(tasks), set[str]()
    running: dict[Future, Task] = {}

    def next_ready() -> Task | None:
        ready = [t for t in pending if waits[t.key] <= finished]
        building = building_ahead().union(*map(builds, running.values()))
        # Such a cell would only wait for the build in its slot (on the 2-core CPU both slots once waited 90 s
        # for the accuracy model's training while cells of built models were ready).
        busy = list(running.values())
        return next((t for t in ready if not builds(t) & building and not waits_for_its_worker(t, busy, pending)),
                    ready[0] if ready else None)

    with _cell_threads(jobs, processes) as threads:
        while pending or running:
            while len(running) < jobs and (ready := next_ready()):
                pending.remove(ready)
                running[threads.submit(one, ready)] = ready
            if not running:  # only a wait on a task that is not in the list could leave work pending here
                raise RuntimeError(f"cells wait for cells that never run: {[t.key for t in pending][:5]}")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()
                finished.add(running.pop(future).key)


def _run_on_whole_gpus(tasks: list[Task], devices: int, one: Callable[[Task, list[int]], None],
                       processes: CellProcesses) -> None:
    """Each task on `gpus_needed` GPUs no other cell uses meanwhile, as many at once as the GPUs allow, in order."""
    pending, free = list(tasks), list(range(devices))
    running: dict[Future, list[int]] = {}
    with _cell_threads(max(1, devices), processes) as threads:
        while pending or running:
            while pending and pending[0].cell.gpus_needed <= len(free):
                task = pending.pop(0)
                gpus, free = free[:task.cell.gpus_needed], free[task.cell.gpus_needed:]
                running[threads.submit(one, task, gpus)] = gpus
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()
                free = sorted(free + running.pop(future))


@contextmanager
def _cell_threads(workers: int, processes: CellProcesses) -> Iterator[ThreadPoolExecutor]:
    """Threads that each run a cell; an interrupted harness kills every running cell before it stops."""
    threads = ThreadPoolExecutor(max_workers=workers)
    try:
        yield threads
    except BaseException:
        processes.kill_all()
        threads.shutdown(wait=True, cancel_futures=True)
        raise
    threads.shutdown()


def run_locally(tasks: list[Task], settings: RunSettings, jobs: int = 1, on_record: OnRecord | None = None,
                slot_env: Callable[[int], dict[str, str]] | None = None, devices: int = 0,
                ranks_env: Callable[[list[int]], dict[str, str]] | None = None, past: PastRuns | None = None
                ) -> list[JudgedRecord]:
    """The tasks run on this machine's slots, `jobs` at once (see `LocalExecutor` and `Executor.run`)."""
    return LocalExecutor(jobs, slot_env, devices, ranks_env, past or PastRuns()).run(tasks, settings, on_record)
