"""What a run shows a person: one progress line per finished cell (verdict, elapsed time, why it did not pass,
a leak, a warm worker's attempt that a fresh process repeated), and the run folder's reports (Markdown, HTML,
JUnit) with their findings pages, and the records of run folders that commands read."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from kvmatrix.harness.record.files import RunDir, unreadable, write_text_atomic
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.reports import findings_pages, html, junit, markdown
from kvmatrix.reports.summary import fresh_rerun


def progress_printer(started: float, say: Callable[[str], None] = lambda line: print(line, flush=True)):
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


def write_findings(folder: Path, records: list[JudgedRecord], cases_dirs: dict[str, Path]) -> list[Path]:
    """The findings pages of a report folder (its `findings/`), written afresh: a failure that is now explained
    (a case or waiver edited, then `rejudge`) loses its page. `cases_dirs`: each run id's cases folder."""
    pages = folder / "findings"
    for stale in pages.glob("*.md"):
        stale.unlink()
    return findings_pages.write(records, pages, cases_dirs)


def records_in(folders: list[str]) -> list[JudgedRecord]:
    """Every record of these run folders, in folder order."""
    return [r for folder in folders for r in RunDir(Path(folder)).records()]


def said_unreadable(records: list[JudgedRecord]) -> bool:
    """Each record file that could not be read, said on stderr (the reports show it as an error too); whether there
    was one: the command then exits non-zero, as a run with an error does."""
    lost = unreadable(records)
    for record in lost:
        print(f"kvmatrix: {record['reason']}", file=sys.stderr)
    return bool(lost)
