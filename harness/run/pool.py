"""Pools run tasks to records: this machine's slots (`LocalPool`, `run_tasks`) or a Ray cluster
(harness/run/ray_pool.py), behind one `Pool` protocol. Both resume: a task whose record is already in the run
folder is not run again; both write each record as its cell finishes, and return every record in task order."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from kvmatrix.harness.judge.facts import facts
from kvmatrix.harness.record.model import JudgedRecord
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.accuracy_plan import baseline_gates, baselines_first
from kvmatrix.harness.run.canary import EnvironmentBroken, canary_failure, pick_canary
from kvmatrix.harness.run.cell_env import run_mark
from kvmatrix.harness.run.cell_run import expected_not_to_pass, judged_record, not_run_reason, unwritable_record
from kvmatrix.harness.run.confirmations import Confirmations, confirmation_gates
from kvmatrix.harness.run.gpu_check import pinned_gpus
from kvmatrix.harness.run.gpu_memory import gpu_baselines
from kvmatrix.harness.run.last_run import last_run_file, remember
from kvmatrix.harness.run.launch import WORKERS_PER_SLOT, FreshProcess, Launcher, WarmWorker
from kvmatrix.harness.run.model_builds import TrainingAhead, trainings_waited_on
from kvmatrix.harness.run.pilots import kernel_family, mark_warm, pilot_gates, warm_families
from kvmatrix.harness.run.process import CellProcesses
from kvmatrix.harness.run.process_start import Exec, ProcessStart
from kvmatrix.harness.run.resume import OnRecord, finished_records
from kvmatrix.harness.run.schedule import order_tasks
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.template import Templates, remove_stale_socket_folders
from kvmatrix.harness.vllm_compat import compiles_per_kv_dtype


class Pool(Protocol):
    def run(self, tasks: list[Task], settings: RunSettings, on_record: OnRecord | None = None) -> list[JudgedRecord]:
        """Every task not already recorded in the run folder, run; all records, finished ones too, in task order.
        `on_record(record, done, total, resumed)` is called once per cell as it finishes (progress lines)."""
        ...


@dataclass
class LocalPool:
    """This machine's slots. `slot_env(slot)` gives each concurrent slot its environment (e.g.
    CUDA_VISIBLE_DEVICES for its GPU). `expected_s` (cell id → expected seconds, e.g. the last run's) starts cells
    longest first, grouped by model and backend (harness/run/schedule.py), cells whose `last_verdicts` failed
    first; without it they start in the given order. `last_backends` (cell id → the backend vLLM picked for it
    last time) tells which cells compile the same kernels on a cold machine (harness/run/pilots.py)."""

    jobs: int = 1
    slot_env: Callable[[int], dict[str, str]] | None = None
    expected_s: dict[str, float] | None = None
    last_verdicts: dict[str, str] | None = None
    devices: int = 0  # this machine's GPUs: a cell spanning several takes whole ones, after the one-GPU cells
    ranks_env: Callable[[list[int]], dict[str, str]] | None = None  # what such a cell sees of its devices
    last_backends: dict[str, str] | None = None

    def run(self, tasks: list[Task], settings: RunSettings, on_record: OnRecord | None = None) -> list[JudgedRecord]:
        records, todo = finished_records(tasks, settings.run_dir, settings.waivers, on_record)
        if self.expected_s is not None:
            todo = order_tasks(todo, self.expected_s, last_verdicts=self.last_verdicts)
        _LocalRun(self, settings, todo, records, len(tasks), on_record).run()
        return [records[t.key] for t in tasks if t.key in records]


class _LocalRun:
    """One LocalPool.run: its slots, cell processes and records, shared by the threads that run its cells."""

    def __init__(self, pool: LocalPool, settings: RunSettings, todo: list[Task], records: dict[str, JudgedRecord],
                 total: int, on_record: OnRecord | None):
        self.pool, self.settings, self.todo, self.records = pool, settings, todo, records
        self.total, self.on_record, self.jobs = total, on_record, max(1, pool.jobs)
        # Before any cell starts: what the slots' GPUs hold that is not this run's.
        baselines = (gpu_baselines(settings.gpu_memory, pinned_gpus(pool.slot_env, self.jobs))
                     if settings.gpu_memory is not None else None)
        self.processes = CellProcesses(baselines, run_mark=run_mark(settings))
        # Why each cell is expected not to pass (None: it is expected to). In a warm run the first such cell of
        # a case confirms its failure in a fresh process, its siblings wait and then stay in warm workers; in any
        # run such a cell is never a pilot.
        self.expected = {t.key: expected_not_to_pass(t, settings, pool.last_verdicts) for t in todo}
        self.warm = settings.isolation == "worker"
        self.confirmations = Confirmations()
        self.lock = threading.Lock()
        self.free_slots = list(range(self.jobs))
        self.start = process_start(settings)  # shared by the slots: one template serves them all
        self.launchers = [slot_launcher(settings, self.start) for _ in range(self.jobs)]
        self.fresh = FreshProcess(settings.cell_command, self.start)
        self.slot_workers = SlotWorkers()
        self.canary = pick_canary(todo, settings, self.expected, list(records.values())) if settings.canary else None
        self.broken: list[str] = []  # why the canary says this environment cannot be judged
        self.canary_ran = threading.Event()

    def run(self) -> None:
        pool, settings = self.pool, self.settings
        # Cells spanning several GPUs run once the one-GPU cells are done, each on whole GPUs of its own; one that
        # needs more GPUs than there are stays with the rest and is skipped there (cell_run.gpus_reason).
        wide = [t for t in self.todo if 1 < t.cell.gpus_needed <= pool.devices]
        todo = [t for t in self.todo if t not in wide]
        todo, waits = start_plan(todo, settings, self.expected, self.jobs, timed=bool(pool.expected_s),
                                 backends=pool.last_backends)
        if self.canary is not None:  # first, waiting for nothing; the other slots start beside it, and keep
            canary = self.canary.key  # nothing before it ran (so none may be a cell it waits for)
            todo = [self.canary] + [t for t in todo if t.key != canary]
            waits = {**waits, canary: set()}
        runnable = [] if settings.use_hub else [t for t in todo if not_run_reason(t, settings) is None]
        training = TrainingAhead(runnable, settings.models, settings.cache_dir / "models", settings.built)
        try:
            _run_gated(todo, waits, self.one, self.processes, self.jobs,
                       lambda task: trainings_waited_on(task, settings.models, settings.built), training.busy,
                       self.waits_for_its_worker)
        finally:
            for launcher in self.launchers:
                launcher.close()
            self.start.close()
        if self.broken:
            raise EnvironmentBroken(self.broken[0])
        _run_on_whole_gpus(wide, pool.devices, self.one_wide, self.processes)

    def keep(self, task: Task, record: JudgedRecord) -> None:
        try:
            self.settings.run_dir.write(record)
        except OSError as err:  # a full disk: the run goes on; the reports show the cell, a resume runs it again
            record = unwritable_record(task, self.settings.run_dir.root.name, err, record)
        else:
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
        try:
            if self.processes.stopping or self.broken:
                return
            try:
                record = self._in_slot(task)
            except OSError as err:  # the cell's files (spec, log) could not be written: this cell's error
                record = unwritable_record(task, self.settings.run_dir.root.name, err)
            if is_canary and not self.processes.stopping and (why := canary_failure(task, record)):
                self.broken.append(why)
                self.processes.kill_all()  # the cells beside it run in an environment that cannot be judged
        finally:
            if is_canary:
                self.canary_ran.set()
        if self.processes.stopping or self.broken or not self._canary_passed():
            return
        self.keep(task, record)
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
            slot_env = self.pool.slot_env(slot) if self.pool.slot_env else None
            record = judged_record(task, self.settings, self.processes, slot_env, self.launchers[slot],
                                   self.expected[task.key] if self.warm else None, self.confirmations, self.fresh)
        finally:
            with self.lock:
                if record is not None:
                    self.slot_workers.ran(slot, case_env, record)
                self.free_slots.append(slot)
        return record

    def one_wide(self, task: Task, gpus: list[int]) -> None:
        ranks_env = self.pool.ranks_env
        env = ranks_env(gpus) if ranks_env else {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
        # A fresh process each: the ranks are the engine's own processes, nothing a slot's worker could keep.
        try:
            record = judged_record(task, self.settings, self.processes, env)
        except OSError as err:
            record = unwritable_record(task, self.settings.run_dir.root.name, err)
        if not self.processes.stopping:
            self.keep(task, record)


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


def start_plan(todo: list[Task], settings: RunSettings, expected: dict[str, str | None], jobs: int,
               timed: bool = False, backends: dict[str, str] | None = None) -> tuple[list[Task], dict[str, set[str]]]:
    """The order the one-GPU cells start in and which task keys each waits for: its baseline; with several slots
    on a cold machine, its kernel family's pilot (harness/run/pilots.py; `backends`: the history's pick per cell),
    the pilots first unless the order is `timed` (a history's, longest first); in a warm run, the first cell of
    its case expected to fail for the same reason (`expected`: task key → why, or None), those first cells ahead
    of all."""
    waits = baseline_gates(todo)
    baselines_first(todo)  # cells that would wait for each other are named before any runs, not after the rest
    lead: list[Task] = []
    if jobs > 1:
        # A compared cell waits for its oracle (or twins), so it cannot be the pilot they wait for.
        can_pilot = {t.key for t in todo if expected[t.key] is None and not_run_reason(t, settings) is None
                     and not t.cell.compared_with(t.gpu_name)}
        todo, pilot_waits = pilot_gates(todo, warm_families(settings), can_pilot, pilots_first=not timed,
                                        backends=backends)
        waits = {key: waits[key] | pilot_waits[key] for key in waits}
        if not timed:  # the pilots of a forced backend first: the long JIT builds, a cold run's critical path
            pilots = set().union(*pilot_waits.values())
            lead = [t for t in todo
                    if t.key in pilots and compiles_per_kv_dtype(t.cell.axes["attention_backend"] or "")]
    if settings.isolation == "worker":
        confirming = confirmation_gates(todo, expected)
        waits = add_acyclic(waits, confirming)
        # The cells a case's siblings wait for start first: each holds back a chain (on a cold H200 the glm-fp8
        # confirmation, last in a longest-first order, held its 11 siblings to the end of the run).
        heads = set().union(*confirming.values())
        todo = [t for t in todo if t.key in heads] + [t for t in todo if t.key not in heads]
    return lead + prerequisites_first([t for t in todo if t not in lead], waits), waits


def prerequisites_first(tasks: list[Task], waits: dict[str, set[str]]) -> list[Task]:
    """The tasks in the given order, each preceded by the tasks it waits for (transitively) that are not placed
    yet: a cell that an early cell waits for starts early too (on a cold H200 the confirmation of an fp8_e5m2
    cell started first and waited for its eager oracle, 89th in the order: a 180 s FlashInfer build that then
    started half-way through the run)."""
    by_key = {t.key: t for t in tasks}
    position = {t.key: i for i, t in enumerate(tasks)}
    placed: list[Task] = []
    seen: set[str] = set()

    def place(task: Task) -> None:
        if task.key in seen:
            return
        seen.add(task.key)
        for key in sorted(waits.get(task.key, ()) & by_key.keys(), key=position.__getitem__):
            place(by_key[key])
        placed.append(task)

    for task in tasks:
        place(task)
    return placed


def add_acyclic(waits: dict[str, set[str]], more: dict[str, set[str]]) -> dict[str, set[str]]:
    """`waits` with the waits of `more` added, each unless it would close a cycle (cells waiting for each other
    would never start)."""
    merged = {key: set(keys) for key, keys in waits.items()}

    def reaches(start: str, target: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            key = stack.pop()
            if key == target:
                return True
            if key not in seen:
                seen.add(key)
                stack.extend(merged.get(key, ()))
        return False

    for key, keys in more.items():
        for other in keys:
            if not reaches(other, key):
                merged.setdefault(key, set()).add(other)
    return merged


def _run_gated(tasks: list[Task], waits: dict[str, set[str]], one: Callable[[Task], None],
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

    with _cell_threads(jobs, processes) as pool:
        while pending or running:
            while len(running) < jobs and (ready := next_ready()):
                pending.remove(ready)
                running[pool.submit(one, ready)] = ready
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
    with _cell_threads(max(1, devices), processes) as pool:
        while pending or running:
            while pending and pending[0].cell.gpus_needed <= len(free):
                task = pending.pop(0)
                gpus, free = free[:task.cell.gpus_needed], free[task.cell.gpus_needed:]
                running[pool.submit(one, task, gpus)] = gpus
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()
                free = sorted(free + running.pop(future))


@contextmanager
def _cell_threads(workers: int, processes: CellProcesses) -> Iterator[ThreadPoolExecutor]:
    """Threads that each run a cell; an interrupted harness kills every running cell before it stops."""
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        yield pool
    except BaseException:
        processes.kill_all()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()


def run_tasks(
    tasks: list[Task],
    settings: RunSettings,
    jobs: int = 1,
    on_record: OnRecord | None = None,
    slot_env: Callable[[int], dict[str, str]] | None = None,
    expected_s: dict[str, float] | None = None,
    last_verdicts: dict[str, str] | None = None,
    devices: int = 0,
    ranks_env: Callable[[list[int]], dict[str, str]] | None = None,
    last_backends: dict[str, str] | None = None,
) -> list[JudgedRecord]:
    """This machine's pool in one call (see `LocalPool` and `Pool.run`)."""
    return LocalPool(jobs, slot_env, expected_s, last_verdicts, devices, ranks_env, last_backends).run(
        tasks, settings, on_record)
