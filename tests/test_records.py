"""Record files: atomic, readable back, resumable, and never outside the run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvmatrix.harness.record.files import RunDir, json_text

JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                           max_leaves=20)


def test_write_and_read_back(tmp_path):
    run = RunDir(tmp_path / "run")
    record = {"cell_id": "c[kv=fp8,skip=0+3,spec=-]", "gpu_class": "cpu", "verdict": "pass", "reason": "ok"}
    path = run.write(record)
    assert path.parent == run.root and run.read(record["cell_id"], "cpu") == record
    assert run.records() == [record]
    assert not list(run.root.glob(".tmp-*")), "no temporary file is left behind"


@given(st.dictionaries(st.text(), JSON_VALUES, max_size=8))
def test_a_record_file_reads_back_as_written_one_field_a_line(record):
    """A record's file reads back as the record: the same fields in the same order, NaN and the infinities as
    Python's json writes them; each top-level field on a line of its own, however its strings break lines."""
    text = json_text(record)
    back = json.loads(text)
    assert list(back) == list(record)
    assert json.dumps(back) == json.dumps(record)  # as text: NaN is not equal to itself
    assert len(text.splitlines()) == (len(record) + 2 if record else 1)


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


@pytest.mark.parametrize(("content", "why"), [
    ('{"cell_id": "torn[kv=fp8,skip=-,spec=-]", "verd', "not JSON"),  # torn mid-write by a disk, not by a rename
    ("", "not JSON"),  # emptied
    (b"\xff\xfe{}", "not JSON"),  # not UTF-8
    ('{"something": 1}', "not a judged record"),  # not a record at all
    ('{"cell_id": "torn[kv=fp8,skip=-,spec=-]", "verdict": "fail", "status": "sideways"}', "field 'status'"),
    ('{"cell_id": "torn[kv=fp8,skip=-,spec=-]", "phase": "done", "status": "ok"}', "not a judged record"),  # a result
])
def test_an_unreadable_record_file_is_its_cells_error_never_absent(tmp_path, content, why):
    """Before, a torn or emptied record vanished from every reader: a run with one FAIL read as all passes."""
    run = RunDir(tmp_path)
    run.write({"cell_id": "ok[kv=auto,skip=-,spec=-]", "gpu_class": "cpu", "verdict": "pass"})
    path = run.record_path("torn[kv=fp8,skip=-,spec=-]", "cpu")
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    ok, torn = run.records()
    assert ok["verdict"] == "pass"
    assert (torn["cell_id"], torn["gpu_class"], torn["verdict"], torn["status"]) == (
        "torn[kv=fp8,skip=-,spec=-]", "cpu", "error", "error")
    assert why in torn["unreadable_record"] and path.name in torn["reason"]
    assert run.read("torn[kv=fp8,skip=-,spec=-]", "cpu") is None  # a resume runs the cell again
    with pytest.raises(ValueError, match="never written"):
        run.write(torn)


def test_long_cell_ids_get_file_names_a_file_system_takes(tmp_path):
    """A 206-character case name made every file of its cells too long a name (OSError: the run stopped)."""
    run = RunDir(tmp_path)
    long_id, other = "a" * 206 + "[kv=auto,skip=-,spec=-]", "a" * 206 + "[kv=fp8,skip=-,spec=-]"
    path = run.write({"cell_id": long_id, "gpu_class": "cpu-avx512", "verdict": "pass"})
    assert len(path.name.encode()) <= 255 - len(".123456789.result.json")
    assert run.read(long_id, "cpu-avx512")["cell_id"] == long_id  # found again by its id: a resume skips it
    assert run.record_path(other, "cpu-avx512") != path  # ids alike up to the cut still differ
    assert run.record_path("ok[kv=auto,skip=-,spec=-]", "cpu").name == "cpu--ok[kv=auto,skip=-,spec=-].json"


def test_runs_folder_is_found_from_the_working_directory(tmp_path, monkeypatch):
    """An installed kvmatrix writes its runs where it is run (or to --runs-dir), never into its package."""
    from kvmatrix.harness.record.files import RUNS_DIR
    from kvmatrix.harness.results.history import DEFAULT_DB
    from kvmatrix.harness.run.session import open_session

    monkeypatch.chdir(tmp_path)
    session = open_session(run_id="here")
    assert session.run_dir.root == tmp_path / "reports" / "runs" / "here"
    assert not RUNS_DIR.is_absolute() and not DEFAULT_DB.is_absolute()
    assert RunDir(Path("elsewhere")).root == tmp_path / "elsewhere"  # absolute: cell processes run in the repo
