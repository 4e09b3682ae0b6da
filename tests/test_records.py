"""Record files: atomic, readable back, resumable, and never outside the run folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RunDir


def test_write_and_read_back(tmp_path):
    run = RunDir(tmp_path / "run")
    record = {"cell_id": "c[kv=fp8,skip=0+3,spec=-]", "gpu_class": "cpu", "verdict": "pass", "reason": "ok"}
    path = run.write(record)
    assert path.parent == run.root and run.read(record["cell_id"], "cpu") == record
    assert run.records() == [record]
    assert not list(run.root.glob(".tmp-*")), "no temporary file is left behind"


@pytest.mark.parametrize("cell_id", ["../../etc/passwd", "a/b", "..", "c[kv=..\\..]", "%2e%2e/x"])
def test_hostile_ids_stay_in_the_run_folder(tmp_path, cell_id):
    run = RunDir(tmp_path / "run")
    path = run.write({"cell_id": cell_id, "gpu_class": "../cpu", "verdict": "fail"})
    assert path.resolve().parent == run.root.resolve()
    assert run.log_path(cell_id, "../cpu").resolve().parent == run.logs.resolve()
    assert run.read(cell_id, "../cpu")["cell_id"] == cell_id


def test_a_record_without_a_verdict_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs cell_id and a verdict"):
        RunDir(tmp_path).write({"cell_id": "x", "gpu_class": "cpu", "verdict": "maybe"})


def test_torn_or_foreign_files_are_not_records(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "cpu--torn.json").write_text('{"cell_id": "torn", "verd')
    (tmp_path / "cpu--other.json").write_text('{"something": 1}')
    assert run.records() == [] and run.read("torn", "cpu") is None


def test_runs_folder_is_found_from_the_working_directory(tmp_path, monkeypatch):
    """An installed kvmatrix writes its runs where it is run (or to --runs-dir), never into its package."""
    from kvmatrix.harness.nightly.history import DEFAULT_DB
    from kvmatrix.harness.record.files import RUNS_DIR
    from kvmatrix.harness.run.session import open_session

    monkeypatch.chdir(tmp_path)
    session = open_session(run_id="here")
    assert session.run_dir.root == tmp_path / "reports" / "runs" / "here"
    assert not RUNS_DIR.is_absolute() and not DEFAULT_DB.is_absolute()
    assert RunDir(Path("elsewhere")).root == tmp_path / "elsewhere"  # absolute: cell processes run in the repo
