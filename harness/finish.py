"""What both front ends (`kvmatrix run`, the pytest plugin) show and write around a run, below the command line: the
history that orders its cells (`history_of`), its first line, a progress line per finished cell, and its end
(`finish_run`: the waivers' problems, the reports, the findings pages, whether it failed). Commands that render
stored run folders (`report`, `rejudge`) write the same reports and findings pages through here."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from kvmatrix.harness.judge.waivers import WaiverProblem, cell_keys, waiver_problems
from kvmatrix.harness.record.files import RunDir, write_text_atomic
from kvmatrix.harness.record.parts import FAILING_VERDICTS
from kvmatrix.harness.record.types import JudgedRecord, check_judged
from kvmatrix.harness.results import history
from kvmatrix.harness.run.host import host_cpu
from kvmatrix.harness.run.order.policy import PastRuns
from kvmatrix.harness.run.plan import RunPlan
from kvmatrix.matrix.schema import CaseError
from kvmatrix.reports import findings_pages, html, junit, markdown
from kvmatrix.reports.summary import fresh_rerun

# Where a run's lines go: stdout for `kvmatrix run`, pytest's terminal for the plugin.
Say = Callable[[str], None]


def history_of(db: Path, gpu_class: str) -> PastRuns:
    """What the history database says of a class's cells: their last seconds, verdicts and backends."""
    connection = history.open_db(db)
    return PastRuns(history.last_timings(connection, gpu_class), history.last_verdicts(connection, gpu_class),
                    history.last_backends(connection, gpu_class))


def first_line(plan: RunPlan, cells: int) -> str:
    settings = plan.settings
    return (f"kvmatrix: {cells} cells for {plan.gpu_name}"
            + (f" (emulated on {plan.emulated_from})" if plan.emulated_from else "")
            + (" (probe-only)" if settings.probe_only else "")
            + f", isolation {settings.isolation}" + (" (processes forked from templates)" if settings.fork_from_template
                                                       else "")
            + f", vLLM {settings.vllm_version}, run {settings.run_dir.root}"
            + (f", on the Ray cluster at {plan.options.ray}" if plan.options.ray else ""))


def progress_printer(started: float, say: Say = lambda line: print(line, flush=True)):
    def show(record: JudgedRecord, done: int, total: int, resumed: bool) -> None:
        took = (record.get("timings") or {}).get("total_s")
        took_text = "resumed" if resumed else (f"{took:.1f} s" if took is not None else "not run")
        note = "" if record["verdict"] == "pass" else f"  {record.get('reason', '')}"
        if record.get("leak"):
            note += f"  LEAK: {record['leak']}"
        if record.get("warm_attempt") and not resumed:
            note += f"  [{fresh_rerun(record)}]"
        if record.get("fresh_first") and not resumed:
            note += "  [fresh process first]"
        say(f"[{done:>3}/{total} {time.monotonic() - started:7.1f} s] {record['verdict'].upper():5} "
            f"{record['cell_id']} @{record.get('gpu_class')} ({took_text}){note}")
    return show


def finish_run(plan: RunPlan, records: list[JudgedRecord], started: host_cpu.Reading, say: Say = print,
               show_report: bool = True) -> bool:
    """Waivers, reports and findings pages, whichever executor (or front end) ran the cells; whether the run
    failed (a failing verdict, or a waiver problem that is an error): each front end says so in its own way."""
    run_dir = plan.settings.run_dir
    problems = known_failure_problems(records, plan, say)
    records = records + [invalid_case_record(err, plan.gpu_name) for err in plan.cases.invalid]
    paths = write_reports(run_dir, records, f"kvmatrix {run_dir.root.name}",
                          header="\n".join(f"- waivers: {p}" for p in problems))
    if show_report:
        say("")
        say(paths["md"].read_text())
    say(f"reports: {paths['md']} {paths['html']} {paths['junit']}  ({time.monotonic() - started.at:.0f} s total)")
    if not plan.options.ray:  # a Ray cluster's cells ran on other hosts
        say(host_cpu.summary(started, host_cpu.reading(), records))
    pages = write_findings(run_dir.root, records, {run_dir.root.name: plan.cases.folder.resolve()})
    if pages:
        say(f"{len(pages)} unexplained failures: a findings page for each in {pages[0].parent}")
    return any(r["verdict"] in FAILING_VERDICTS for r in records) or any(p.is_error for p in problems)


def known_failure_problems(records: list[JudgedRecord], plan: RunPlan,
                           say: Say = lambda line: print(line, file=sys.stderr)) -> list[WaiverProblem]:
    """The waivers' problems over the whole run, said: expired, matching no cell, or removable. The records are
    already under the waivers (judging applied them; a resumed run's kept records got today's as it resumed:
    harness/run/resume.py), and no record file is written here. A waivers file lent to a folder inside cases/
    (cases/surface/) names cells of cases/ that folder does not hold: no "matches no cell"."""
    problems = waiver_problems(records, plan.settings.waivers, known_cells=cell_keys(list(plan.cases.every)))
    if plan.cases.waivers_lent:
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


def write_reports(run_dir: RunDir, records: list[JudgedRecord], title: str, header: str = "",
                  compare_to: str | None = None) -> dict[str, Path]:
    out = {
        "md": run_dir.root / "matrix.md",
        "html": run_dir.root / "matrix.html",
        "junit": run_dir.root / "junit.xml",
    }
    write_text_atomic(out["md"], markdown.render(records, title, header, compare_to))
    write_text_atomic(out["html"], html.render(records, title, header))
    write_text_atomic(out["junit"], junit.render(records))
    return out


def write_findings(folder: Path, records: list[JudgedRecord], cases_dirs: dict[str, Path],
                   run_dirs: dict[str, Path] | None = None,
                   columns: findings_pages.Columns | None = None) -> list[Path]:
    """The findings pages of a report folder (its `findings/`), written afresh: a failure that is now explained
    (a case or waiver edited, then `rejudge`) loses its page. `cases_dirs`, `run_dirs`: each run id's cases folder
    and run folder (default: the report folder itself, a run's own); `columns`: a combined report's, naming the
    pages."""
    pages = folder / "findings"
    for stale in pages.glob("*.md"):
        stale.unlink()
    return findings_pages.write(records, pages, cases_dirs, run_dirs or {run_id: folder for run_id in cases_dirs},
                                columns)
