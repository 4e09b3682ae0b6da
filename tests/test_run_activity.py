"""What a long run says while it runs, and how it stops: a start line per cell, a heartbeat naming the running
cells and the phase each cell process wrote; Ctrl-C that ends the run within seconds even while a template is
still importing, with a partial report; `--resume` that goes on with the run's own options. The command is the
production one (tests/fake_cli_run.py), over the fake cells (tests/fake_cell.py) and template
(tests/fake_template.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.activity import Activity
from tests.conftest import CPU_CLASS, write_case

REPO = Path(__file__).resolve().parent.parent
FAKE_CLI_RUN = [sys.executable, str(REPO / "tests" / "fake_cli_run.py")]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
FOUR = {"kv_cache_dtype": ["auto", "bfloat16", "fp8", "fp8_e5m2"]}


def slow_cases(cases_dir: Path) -> None:
    write_case(cases_dir, "slow", {"model": "llama", "gpus": [CPU_CLASS], "matrix": FOUR, "timeout_s": 60})


def start(cases_dir: Path, work: Path, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([*FAKE_CLI_RUN, str(cases_dir), str(work), "--run-id", "r", *args],
                            env={**ENV, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, seconds: float = 180.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_heartbeat_names_each_running_cell_and_the_phase_its_process_wrote(tmp_path):
    """Before: nothing between a cell's start and its verdict line (55 s silences during compiled cells)."""
    lines: list[str] = []
    cell = SimpleNamespace(cell_id="llama-skip[kv=fp8,skip=-,spec=-]")
    task = SimpleNamespace(key="k", gpu_name=CPU_CLASS, cell=cell)
    result = tmp_path / "k.result.json"
    activity = Activity(lines.append, time.monotonic(), lambda _: result, every=0.3)
    with activity.heartbeat(), activity.running(task):
        time.sleep(1.5)  # no result file yet: the process is starting
        result.write_text(json.dumps({"phase": "init"}))
        time.sleep(1.5)
    assert lines[0].endswith(f"start llama-skip[kv=fp8,skip=-,spec=-] @{CPU_CLASS}")
    beats = lines[1:]
    starting = "running llama-skip[kv=fp8,skip=-,spec=-] (starting: process, imports, "
    assert any(starting in line for line in beats), beats
    assert "(engine start, " in beats[-1], beats


def test_ctrl_c_while_the_template_imports_stops_at_once_with_a_partial_report(cases_dir, tmp_path):
    """Before: Ctrl-C while the template imported waited for its imports (50-55 s on a 2-core CPU; two minutes
    here) before the run ended."""
    slow_cases(cases_dir)
    harness = start(cases_dir, tmp_path, FAKE_TEMPLATES="1", FAKE_TEMPLATE="slow")
    wait_for(lambda: list((tmp_path / "runs" / "r" / "logs" / "templates").glob("template-*.log")))
    time.sleep(1.0)
    asked = time.monotonic()
    harness.send_signal(signal.SIGINT)
    out, err = harness.communicate(timeout=60)
    took = time.monotonic() - asked
    assert harness.returncode == 130, err
    assert took < 10, f"{took:.0f} s after Ctrl-C"
    assert "start slow[" in out
    assert "partial report of 0 of 4 cells" in err
    assert "(interrupted: 0 of 4 cells)" in (tmp_path / "runs" / "r" / "matrix.md").read_text()


def test_an_interrupted_run_reports_its_cells_and_resumes_with_its_options(cases_dir, tmp_path):
    """Before: no report of the cells an interrupted run finished, and `--resume` ran the rest in warm workers
    though the run was started with `--isolation process`."""
    slow_cases(cases_dir)
    harness = start(cases_dir, tmp_path, "--isolation", "process", "--no-template", FAKE_CELL_SLEEP="3")
    run = tmp_path / "runs" / "r"
    wait_for(lambda: len(RunDir(run).records()) >= 2)
    harness.send_signal(signal.SIGINT)
    out, err = harness.communicate(timeout=30)
    assert harness.returncode == 130, err
    done = len(RunDir(run).records())
    assert f"(interrupted: {done} of 4 cells)" in (run / "matrix.md").read_text()

    resumed = subprocess.run([*FAKE_CLI_RUN, str(cases_dir), str(tmp_path), "--resume"],
                             env={**ENV, "FAKE_CELL_SLEEP": "0"}, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed with its options --isolation process --no-template" in resumed.stdout
    records = RunDir(run).records()
    assert len(records) == 4 and {r["isolation"] for r in records} == {"process"}
