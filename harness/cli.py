"""`kvmatrix`: the command line over matrix/ (cases → cells), harness/ (cells → records) and reports/."""

from __future__ import annotations

import argparse
import fnmatch
import sys
import time
from pathlib import Path

from harness.records import RUNS_DIR, RunDir
from harness.runner import run_tasks
from harness.session import DEFAULT_CACHE, dtype_checker, open_session
from matrix.expand import Cell, expand_case
from matrix.load import CASES_DIR, case_files, load_case, load_models, load_pool
from matrix.pool import PoolError
from matrix.schema import CaseError
from reports import html, junit, markdown


def load_cells(args: argparse.Namespace, tolerant: bool = False) -> tuple[list[Cell], list[CaseError]]:
    """The selected cells. With `tolerant`, a case file that fails to load or expand is set aside as an error
    (the other cases still run); otherwise the first bad file stops the command."""
    cases_dir = Path(args.cases_dir)
    files = case_files(cases_dir)
    if args.case:
        files = [f for f in files if f.stem in args.case]
    models, pool, check = load_models(cases_dir), load_pool(cases_dir), dtype_checker()
    cells: list[Cell] = []
    errors: list[CaseError] = []
    for path in files:
        try:
            cells.extend(expand_case(load_case(path, check), models, pool, str(path)))
        except CaseError as err:
            if not tolerant:
                raise
            errors.append(err)
    if args.k:
        cells = [c for c in cells if _selected(c.cell_id, args.k)]
    if args.cell:
        cells = [c for c in cells if c.cell_id in args.cell]
    return cells, errors


def invalid_case_record(err: CaseError, gpu_name: str) -> dict:
    """A report entry (never a record file: a fixed file must not stay failed) for a case that did not load."""
    case = err.case or Path(err.file).stem
    return {"cell_id": f"{case}[invalid]", "case": case, "gpu_class": gpu_name, "status": "error",
            "verdict": "error", "reason": str(err), "expectations": []}


def _selected(cell_id: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(cell_id, pattern) if set("*?[") & set(pattern) else pattern in cell_id


def progress_printer(started: float):
    def show(record: dict, done: int, total: int, resumed: bool) -> None:
        took = (record.get("timings") or {}).get("total_s")
        took_text = "resumed" if resumed else (f"{took:.1f} s" if took is not None else "")
        note = "" if record["verdict"] == "pass" else f"  {record.get('reason', '')}"
        print(f"[{done:>3}/{total} {time.monotonic() - started:7.1f} s] {record['verdict'].upper():5} "
              f"{record['cell_id']} @{record.get('gpu_class')} ({took_text}){note}", flush=True)
    return show


def write_reports(run_dir: RunDir, records: list[dict], title: str) -> dict[str, Path]:
    out = {
        "md": run_dir.root / "matrix.md",
        "html": run_dir.root / "matrix.html",
        "junit": run_dir.root / "junit.xml",
    }
    out["md"].write_text(markdown.render(records, title))
    out["html"].write_text(html.render(records, title))
    out["junit"].write_text(junit.render(records))
    return out


def cmd_run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    cells, invalid = load_cells(args, tolerant=True)
    for err in invalid:
        print(f"kvmatrix: {err}", file=sys.stderr)
    session = open_session(args.gpu, args.emulate, args.run_id, Path(args.runs_dir), Path(args.cache_dir),
                           Path(args.cases_dir), args.hub, args.timeout_scale)
    tasks = session.tasks(cells)
    settings = session.settings
    print(f"kvmatrix: {len(tasks)} cells for {session.gpu_name}"
          + (f" (emulated on {session.emulated_from})" if session.emulated_from else "")
          + f", vLLM {settings.vllm_version}, run {session.run_dir.root}", flush=True)
    session.build_models(tasks)
    records = run_tasks(tasks, settings, jobs=args.jobs or session.slots, on_record=progress_printer(started),
                        slot_env=session.slot_env)
    records += [invalid_case_record(err, session.gpu_name) for err in invalid]
    paths = write_reports(session.run_dir, records, f"kvmatrix {session.run_dir.root.name}")
    print()
    print(paths["md"].read_text())
    print(f"reports: {paths['md']} {paths['html']} {paths['junit']}  ({time.monotonic() - started:.0f} s total)")
    return 1 if any(r["verdict"] in ("fail", "error") for r in records) else 0


def cmd_list(args: argparse.Namespace) -> int:
    cells, _ = load_cells(args)
    for cell in cells:
        print(f"{cell.cell_id}  [{', '.join(cell.gpu_classes)}]")
    print(f"{len(cells)} cells", file=sys.stderr)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    records = []
    for folder in args.run_dirs:
        records.extend(RunDir(Path(folder)).records())
    run_dir = RunDir(Path(args.out or args.run_dirs[0]))
    run_dir.root.mkdir(parents=True, exist_ok=True)
    paths = write_reports(run_dir, records, args.title)
    print(paths["md"].read_text())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvmatrix", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def selection(p: argparse.ArgumentParser) -> None:
        p.add_argument("--cases-dir", default=str(CASES_DIR), help="folder of case files (default: cases/)")
        p.add_argument("--case", action="append", help="only this case (file stem); repeatable")
        p.add_argument("-k", help="only cells whose id contains this (or matches this glob)")
        p.add_argument("--cell", action="append", help="only this exact cell id; repeatable")

    run = sub.add_parser("run", help="run the matrix for this machine's GPU class")
    selection(run)
    run.add_argument("--gpu", help="GPU class to run as (default: this machine's)")
    run.add_argument("--emulate", action="store_true", help="emulate --gpu's decisions on this machine's GPU")
    run.add_argument("--run-id", help="results folder name; the same id resumes (default: date-class-version)")
    run.add_argument("--runs-dir", default=str(RUNS_DIR))
    run.add_argument("--jobs", type=int, default=0,
                     help="cells at once (default: GPUs x the class's slots_per_device; 1 on the CPU)")
    run.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="built models and compile/JIT caches")
    run.add_argument("--hub", action="store_true", help="use the registry's hub ids instead of tiny models")
    run.add_argument("--timeout-scale", type=float, default=1.0)
    run.set_defaults(func=cmd_run)

    lst = sub.add_parser("list", help="list the cells the cases expand to")
    selection(lst)
    lst.set_defaults(func=cmd_list)

    rep = sub.add_parser("report", help="render the reports of one or more run folders")
    rep.add_argument("run_dirs", nargs="+")
    rep.add_argument("--out", help="folder for the reports (default: the first run folder)")
    rep.add_argument("--title", default="kvmatrix")
    rep.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CaseError, PoolError) as err:
        print(f"kvmatrix: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
