"""One run's plan, made once before any cell starts, by `plan_run`, for `kvmatrix run`, the pytest front end and
a bisection step's cells (`kvmatrix bisect`, `pr`'s two sides, `qualify`'s bisections) alike: what the user asked
(`RunOptions`) turned into the final settings, the GPU class, the cases loaded once, the tasks, the slots and what
earlier runs saw, and the order its cells start in (their canary first). Nothing in it changes afterwards: its
contents are values (tuples, frozen dataclasses, read-only mappings); `narrowed` makes the plan of a front end's
selection of its tasks, and `execute` runs a plan's tasks on this machine's slots or a Ray cluster, both obeying
its start order."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from kvmatrix.harness.judge.known_failures import known_failures_for
from kvmatrix.harness.record.files import RUNS_DIR
from kvmatrix.harness.record.paths import DEFAULT_CACHE
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.run.activity import Activity
from kvmatrix.harness.run.cases import CaseSelection, select_cells
from kvmatrix.harness.run.executor.local import LocalExecutor, OnRecord
from kvmatrix.harness.run.guards import cases_dir_for, check_free_disk, claim_run_folder, hold_run_folder
from kvmatrix.harness.run.host.slots import Slots
from kvmatrix.harness.run.last_run import last_run_file, recall
from kvmatrix.harness.run.order.policy import PastRuns, StartOrder
from kvmatrix.harness.run.order.start_order import planned_order
from kvmatrix.harness.run.run_ids import checked_run_id, resumed_run_id
from kvmatrix.harness.run.session import Session, open_session, waivers_lent
from kvmatrix.harness.run.settings import CELL_COMMAND, WORKER_COMMAND, RunSettings, frozen
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.machine import PoolError
from kvmatrix.matrix.schema import CaseError, GpuClass

# Of the tasks of the cases, those a run keeps, given the installed vLLM's version (`--declared-only`: the points
# vLLM declares supported; `--refused-only`: the others).
TaskFilter = Callable[[list[Task], str | None], list[Task]]
# What the history says of a class's cells (its path, the class); raises sqlite3.Error or ValueError if unreadable.
HistoryReader = Callable[[Path, str], PastRuns]
Say = Callable[[str], None]


@dataclass(frozen=True)
class RunOptions:
    """What a user may ask of a run: `kvmatrix run`'s arguments, the pytest front end's options."""

    gpu: str | None = None  # the class to run as (default: this machine's)
    emulate: bool = False  # emulate `gpu`'s decisions on this machine's GPU
    run_id: str | None = None  # the results folder under `runs_dir`; an existing one is resumed
    resume: str | None = None  # an earlier run to go on with: its id, or `latest`
    runs_dir: Path = RUNS_DIR
    cache_dir: Path = DEFAULT_CACHE
    cases_dir: Path | None = None  # None: the one the run folder was made with, else the built-in cases
    selection: CaseSelection = CaseSelection()
    # The cells to run, found by the caller in `cases_dir` (a bisection step expresses each cell itself, reading its
    # case without checking every cell against this vLLM); None: the cells `selection` picks.
    cells: tuple[Cell, ...] | None = None
    use_hub: bool = False
    timeout_scale: float = 1.0
    jobs: int = 0  # cells at once; 0: as the machine allows
    shared_by: int = 1  # processes sharing this machine's slots (pytest-xdist's workers)
    isolation: str = "worker"
    template: bool = True  # on a CPU class, fork cell processes and workers from a template
    cpu_ranks: int | None = None  # on a CPU class, run cells spanning up to this many ranks
    only: TaskFilter | None = None  # `--declared-only` / `--refused-only`
    probe_only: bool = False
    ray: str | None = None  # the address of a Ray cluster to run the cells on
    ray_real_gpus: bool = False
    history_db: Path | None = None  # whose last verdicts and timings order the cells
    # Order the cells by what earlier runs of the class saw (the history, else the last run on these caches); off
    # for a bisection step, whose environment is not theirs (a cell that failed in another vLLM would start alone in
    # a fresh process instead of its step's warm worker).
    read_past: bool = True
    force: bool = False  # resume a results folder made with other case files
    min_free_gib: float = 2.0
    waivers: bool = True  # judge with the cases' known failures (a bisection step looks for the raw verdict)
    canary: bool = True  # the plainest cell first, the run stopped if it does not run (harness/run/order/canary.py)


@dataclass(frozen=True)
class Cases:
    """The cases of a run, loaded once: the cells selected, every cell of the matrix (the waivers' problems), the
    case files set aside (invalid), the folder they came from and whether its waivers file is the default case
    set's, lent to it."""

    folder: Path
    selected: tuple[Cell, ...]
    every: tuple[Cell, ...]
    invalid: tuple[CaseError, ...]
    waivers_lent: bool


@dataclass(frozen=True)
class RunPlan:
    """A run ready to start, every part of it a value: `settings` are final (the canary on, the isolation,
    templates and ranks asked); `tasks` the selected cells on `gpu_name`; `slots` this machine's; `past` what
    earlier runs of the class saw; `order` the order the tasks not yet recorded start in, its canary and what each
    waits for, which every executor obeys. What the run learns (the models it builds, its records) is its own."""

    options: RunOptions
    settings: RunSettings
    gpu_name: str
    emulated_from: str | None
    gpu_classes: Mapping[str, GpuClass]
    cases: Cases
    tasks: tuple[Task, ...]
    slots: Slots
    past: PastRuns
    order: StartOrder


def plan_run(options: RunOptions, read_history: HistoryReader | None = None, say: Say = print, claim: bool = True,
             lock: bool = False) -> RunPlan:
    """Everything before the cells: the cases loaded (each one set aside said with `say`), the class and settings,
    the run folder claimed (unless `claim` is False: a listing makes no folder; `lock`: one run writes the folder
    at a time, held until `release_run_folder`), the tasks chosen, the slots, the history read with `read_history`,
    and the tasks' start order."""
    run_id = resumed_run_id(options.resume, options.runs_dir) if options.resume else options.run_id
    run_id = checked_run_id(run_id) if run_id is not None else None
    cases = load_cases(options, run_id)
    for err in cases.invalid:
        say(f"kvmatrix: {err}")
    if options.ray and options.emulate:
        raise PoolError("--emulate with --ray: a Ray pool runs each class on nodes of that class; drop --emulate")
    session = open_session(gpu=options.gpu, emulate=options.emulate, run_id=run_id, runs_dir=options.runs_dir,
                           cache_dir=options.cache_dir, cases_dir=cases.folder, use_hub=options.use_hub,
                           timeout_scale=options.timeout_scale, probe_only=options.probe_only,
                           on_ray=bool(options.ray), with_waivers=options.waivers)
    if claim:
        _claim(options, session, cases.folder, lock)
    tasks = session.tasks(list(cases.selected))
    if options.only:
        tasks = options.only(tasks, session.settings.vllm_version)
    machine_slots = session.slots().count
    jobs = options.jobs or (max(1, machine_slots // options.shared_by) if options.shared_by > 1 else 0)
    past = PastRuns() if options.ray or not options.read_past else read_past(options.history_db, read_history,
                                                                                 session)
    settings = frozen(replace(run_settings(options, session), known_failures=known_failures_for(cases.selected)))
    plan = RunPlan(options, settings, session.gpu_name, session.emulated_from, MappingProxyType(dict(session.pool)),
                   cases, (), session.slots(jobs), frozen_past(past), StartOrder.given([]))
    return narrowed(plan, tasks)


def narrowed(plan: RunPlan, tasks: Sequence[Task]) -> RunPlan:
    """The plan for `tasks` of its tasks (those a front end selected, pytest's `-k`, or a bisection step's this vLLM
    can express), with their start order: those already recorded in the run folder (a resumed run) keep their
    records; on a Ray cluster every cell runs alone in a fresh process on a node of its own, so no kernel family's
    pilot or warm worker's confirmation orders them (one slot, no warm workers), only the canary and their
    neighbours do."""
    settings = plan.settings
    finished = [r for t in tasks if (r := settings.run_dir.read(t.cell.cell_id, t.gpu_name)) is not None]
    slots = 1 if plan.options.ray else plan.slots.count
    order = planned_order(list(tasks), settings, slots, settings.gpus_here or 0, plan.past, finished)
    return replace(plan, tasks=tuple(tasks), order=order)


def load_cases(options: RunOptions, run_id: str | None) -> Cases:
    """The cases folder (the one asked, else the resumed run's, else the built-in one) and its cells; a case file
    that does not load is set aside, the others still run."""
    folder = cases_dir_for(options.cases_dir, options.runs_dir / run_id if run_id else None)
    if options.cells is not None:
        return Cases(folder, options.cells, options.cells, (), waivers_lent(folder))
    selected, invalid, every = select_cells(folder, options.selection, tolerant=True)
    return Cases(folder, tuple(selected), tuple(every), tuple(invalid), waivers_lent(folder))


def _claim(options: RunOptions, session: Session, cases_dir: Path, lock: bool) -> None:
    check_free_disk(options.runs_dir, options.min_free_gib)
    if lock:
        hold_run_folder(session.run_dir.root)
    claim_run_folder(session.run_dir.root, cases_dir, options.force)


def run_settings(options: RunOptions, session: Session) -> RunSettings:
    """The session's settings with what the user asked: the isolation, the canary (every front end runs it; a
    bisection step does not), the CPU ranks, and templates on a CPU class."""
    settings = session.settings
    if options.cpu_ranks and (session.host.device != "cpu" or not 1 < options.cpu_ranks <= len(session.cores)):
        raise PoolError(f"--cpu-ranks takes 2 to {len(session.cores)} (the cores this run may use), on a CPU class")
    # A template forks the harness's own cell and worker: a run given other commands (a test's) runs those.
    own_commands = (settings.cell_command, settings.worker_command) == (CELL_COMMAND, WORKER_COMMAND)
    # A Ray cluster runs each cell in a fresh process (harness/run/executor/ray.py): no warm workers there.
    return replace(settings, isolation="process" if options.ray else options.isolation, canary=options.canary,
                   gpus_here=options.cpu_ranks or settings.gpus_here,
                   fork_from_template=session.host.device == "cpu" and options.template and own_commands)


def read_past(db: Path | None, read_history: HistoryReader | None, session: Session) -> PastRuns:
    """What earlier runs of the class saw: the history's (cells that failed last time start first, then longest
    first: a run's first failures show early and no long cell starts last), else the last runs' on these caches."""
    past = PastRuns({})
    if db is not None and read_history is not None and db.exists():
        try:
            past = read_history(db, session.gpu_name)
        except (sqlite3.Error, ValueError) as err:  # only the order depends on it: never stop a run
            print(f"kvmatrix: the history {db} could not be read ({err}); cells start in the cases' order",
                  file=sys.stderr)
    if past.expected_seconds:
        return past
    settings = session.settings
    expected, verdicts, backends = recall(last_run_file(settings.cache_dir, session.gpu_name, settings.vllm_version))
    return PastRuns(expected, verdicts, backends)


def frozen_past(past: PastRuns) -> PastRuns:
    return PastRuns(None if past.expected_seconds is None else MappingProxyType(dict(past.expected_seconds)),
                    MappingProxyType(dict(past.verdicts)), MappingProxyType(dict(past.backends)))


def execute(plan: RunPlan, on_record: OnRecord | None = None, activity: Activity | None = None) -> list[JudgedRecord]:
    """The plan's tasks run on its executor, this machine's slots or the Ray cluster it names, in the plan's start
    order; every record, in task order. `activity` hears each local cell start."""
    if plan.options.ray:
        return _on_ray(plan, on_record)
    executor = LocalExecutor(slots=plan.slots.count, slot_env=plan.slots.env, devices=plan.settings.gpus_here or 0,
                             ranks_env=plan.slots.ranks_env, activity=activity)
    return executor.run(list(plan.tasks), plan.order, plan.settings, on_record)


def _on_ray(plan: RunPlan, on_record: OnRecord | None) -> list[JudgedRecord]:
    """An existing Ray cluster's nodes of the class (harness/run/executor/ray.py); records land here as local ones
    do."""
    import ray  # only a Ray cluster needs Ray

    from kvmatrix.harness.run.executor.ray import RayExecutor

    ray.init(address=plan.options.ray)
    try:
        executor = RayExecutor(real_gpus=plan.options.ray_real_gpus, gpu_classes=plan.gpu_classes)
        return executor.run(list(plan.tasks), plan.order, plan.settings, on_record)
    finally:
        ray.shutdown()
