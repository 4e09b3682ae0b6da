"""Records are written by the runner only: a run resumed under a changed waivers file puts the records it keeps
under today's waivers as it resumes (harness/run/resume.py, writing back only those the waivers change), and
`kvmatrix run`'s finish step (the waivers' problems, reports, findings) writes no record file. Over the fake cells
(tests/fake_cell.py: the real cell protocol) through the production `kvmatrix run`."""

from __future__ import annotations

import inspect
from pathlib import Path

from kvmatrix.harness.cli import run as cli_run
from kvmatrix.harness.record.files import RunDir
from tests.conftest import CPU_CLASS, KNOWN_LINK
from tests.test_run_inputs import CRASH, run_fake

REPO = Path(__file__).resolve().parent.parent


def record_writers(monkeypatch) -> list[tuple[str, str]]:
    """(the module that wrote it, its cell) for every record file written from now on."""
    writes: list[tuple[str, str]] = []
    write = RunDir.write

    def spied(self: RunDir, record: dict) -> Path:
        caller = Path(inspect.stack()[1].filename).resolve()
        writes.append((str(caller.relative_to(REPO)) if caller.is_relative_to(REPO) else str(caller),
                       record["cell_id"]))
        return write(self, record)

    monkeypatch.setattr(RunDir, "write", spied)
    return writes


def record_files(run_dir: RunDir) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(run_dir.root.glob("*.json")) if path.name != "run.json"}


def test_a_resumed_run_waives_the_records_it_keeps_and_its_finish_writes_none(matrix_with_waiver, tmp_path,
                                                                               monkeypatch):
    cases_dir = matrix_with_waiver
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 1
    run_dir = RunDir(tmp_path / "runs" / "r")
    assert run_dir.read(CRASH, CPU_CLASS)["verdict"] == "fail"  # nothing explains it yet
    with (cases_dir / "_waivers.txt").open("a") as waivers:
        waivers.write(f"{CRASH} {KNOWN_LINK}\n")  # now reported upstream

    writers = record_writers(monkeypatch)
    finish_run = cli_run.finish_run
    around_finish: list[dict[str, bytes]] = []

    def finish(*args, **kwargs):
        around_finish.append(record_files(run_dir))
        code = finish_run(*args, **kwargs)
        around_finish.append(record_files(run_dir))
        return code

    monkeypatch.setattr(cli_run, "finish_run", finish)
    # --force: the waivers file is among the files the folder's verdicts were made with.
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--resume", "r", "--force") == 0

    assert writers == [("harness/run/resume.py", CRASH)], "only the record the new waiver changes, by the runner"
    record = run_dir.read(CRASH, CPU_CLASS)
    assert record["verdict"] == "xfail" and record["waived"]["link"] == KNOWN_LINK
    assert record["reason"].startswith(f"waived ({KNOWN_LINK}): ")
    before, after = around_finish
    assert after == before and len(before) == 5, "the finish step wrote no record file"
