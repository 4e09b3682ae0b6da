"""A crashing, hanging, segfaulting or killed cell never takes the run down; a killed harness loses nothing
already recorded, leaves no cell process behind, and a rerun resumes without redoing finished cells.

The cells here are misbehaving stand-ins (tests/fake_cell.py) speaking the real cell protocol, so the harness
under test (runner, records, verdicts, reports) is the production code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RunDir
from kvmatrix.reports import markdown
from tests.conftest import write_case

REPO = Path(__file__).resolve().parent.parent
FAULT_RUN = [sys.executable, str(REPO / "tests" / "fault_run.py")]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def fault_cases(cases_dir: Path, names: list[str], **extra) -> None:
    for name in names:
        write_case(cases_dir, name, {"model": "llama", "gpus": ["cpu-avx512"], "timeout_s": 4, **extra})


def alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (ended, not yet reaped) is gone for our purposes, and so is one that ends while
    it is looked at."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_faulty_cells_do_not_stop_the_run(cases_dir, tmp_path):
    fault_cases(cases_dir, ["ok", "hang", "segv", "killed", "crash", "orphan", "noisy"])
    run = tmp_path / "run"
    done = subprocess.run([*FAULT_RUN, str(cases_dir), str(run)], env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    records = {r["case"]: r for r in RunDir(run).records()}
    assert set(records) == {"ok", "hang", "segv", "killed", "crash", "orphan", "noisy"}
    assert records["ok"]["verdict"] == "pass"
    assert (records["hang"]["status"], records["hang"]["verdict"]) == ("timeout", "fail")
    assert "no result within 4 s (phase init)" in records["hang"]["reason"]
    assert (records["segv"]["status"], records["segv"]["signature"]) == ("crash", "signal_SIGSEGV")
    assert (records["killed"]["status"], records["killed"]["verdict"]) == ("killed", "fail")
    assert "SIGKILL" in records["killed"]["reason"]
    # A kill says nothing of itself: the log's last line (here the cell's own "fake cell ..." line, on vLLM a
    # warning of its start) is not quoted as its cause.
    assert "fake cell" not in records["killed"]["reason"] and "killed from outside" in records["killed"]["reason"]
    assert (records["crash"]["signature"], records["crash"]["verdict"]) == ("no_common_block_size", "fail")
    assert records["orphan"]["verdict"] == "pass"
    (pid_file,) = (run / "work").glob("cpu-avx512--orphan*.result.pid")
    grandchild = int(pid_file.read_text())
    assert not alive(grandchild), "the cell's process group must be killed when it ends"
    log = run / records["noisy"]["log"]
    assert log.stat().st_size < 2 * 1024 * 1024 + 200 and log.read_text().startswith("[kvmatrix: log capped")

    report = markdown.render(list(records.values()))
    for words in ("timed out", "no result within 4 s", "signal_SIGSEGV", "SIGKILL", "no_common_block_size"):
        assert words in report


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_killed_harness_resumes_without_redoing_cells(cases_dir, tmp_path, how):
    fault_cases(cases_dir, ["slow"], matrix={"kv_cache_dtype": ["auto", "bfloat16", "fp8", "fp8_e5m2"]}, timeout_s=30)
    run = tmp_path / "run"
    harness = subprocess.Popen([*FAULT_RUN, str(cases_dir), str(run)], env={**ENV, "FAKE_CELL_SLEEP": "3"},
                               stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(RunDir(run).records()) < 2:
        assert time.monotonic() < deadline and harness.poll() is None
        time.sleep(0.1)
    harness.send_signal(how)
    harness.wait(timeout=30)
    before = {r["cell_id"]: r for r in RunDir(run).records()}
    assert 2 <= len(before) < 4
    assert all(json.loads(p.read_text())["verdict"] == "pass" for p in run.glob("*.json"))
    time.sleep(0.5)
    # This run's cells only (their command line names this run's folder): other tests may run cells meanwhile.
    leftovers = subprocess.run(["pgrep", "-f", f"fake_cell.py {run}"], capture_output=True, text=True).stdout.split()
    assert [pid for pid in leftovers if alive(int(pid))] == [], "a killed harness must not leave cells running"

    rerun = subprocess.run([*FAULT_RUN, str(cases_dir), str(run)], env={**ENV, "FAKE_CELL_SLEEP": "0"},
                           capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    after = {r["cell_id"]: r for r in RunDir(run).records()}
    assert len(after) == 4
    assert rerun.stdout.count("resumed") == len(before)
    for cell_id, record in before.items():
        assert after[cell_id] == record, "finished cells are not run again"
