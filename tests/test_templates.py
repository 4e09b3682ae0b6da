"""Cell processes and warm workers forked from a template (harness/run/process/template_client.py,
harness/cell/template_server.py): a forked cell ends in the record a fresh process gives, whatever it does (a crash, a
signal, a hang past its timeout), and the run goes on; a template that cannot serve (its imports fail, a thread is
alive, it dies) makes its cells start as processes of their own, said once; no template or child outlives the run,
interrupted or not. The templates are the production template loop forking the misbehaving fake cells
(tests/fake_template.py); what real vLLM cells give when forked is checked in test_isolation_equality.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.process.groups import CellProcesses, run_mark_of
from kvmatrix.harness.run.process.start import CellFiles, ShareKey
from kvmatrix.harness.run.process.template_client import Templates, template_key
from kvmatrix.harness.vllm_compat import CPU_THREADS_BIND_ENV, READ_BY_ENGINE_ENV
from tests.conftest import write_case
from tests.fault_run import FAKE_CELL, FAKE_TEMPLATE
from tests.test_warm_workers import BEHAVIOURS, fault_cases

REPO = Path(__file__).resolve().parent.parent
FAULT_RUN = [sys.executable, str(REPO / "tests" / "fault_run.py")]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_CELL_SLEEP": "0"}


def run_faults(cases_dir: Path, run: Path, isolation: str, *template: str, **env: str) -> tuple[dict[str, dict], str]:
    done = subprocess.run([*FAULT_RUN, str(cases_dir), str(run), "1", isolation, *template], env={**ENV, **env},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return {r["case"].split("-", 1)[1]: r for r in RunDir(run).records()}, done.stdout


def outcome(record: dict) -> tuple:
    return record["verdict"], record["status"], record.get("signature"), record.get("signal")


def processes_of_run(run: Path) -> list[int]:
    """Every process alive whose environment names this run folder (a template, a forked child, a grandchild)."""
    mark = str(run.resolve())
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and run_mark_of(int(pid)) == mark]


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def wait_until_gone(run: Path, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while processes_of_run(run):
        assert time.monotonic() < deadline, f"processes outlived the run: {processes_of_run(run)}"
        time.sleep(0.1)


@pytest.mark.parametrize("isolation", ["process", "worker"])
def test_forked_cells_end_as_in_processes_of_their_own(cases_dir, tmp_path, isolation):
    fault_cases(cases_dir)
    execed, _ = run_faults(cases_dir, tmp_path / "exec", "process")
    forked, output = run_faults(cases_dir, tmp_path / "forked", isolation, "template")
    assert set(forked) == set(BEHAVIOURS)
    for name in BEHAVIOURS:  # a segfault, a kill and a hang past the timeout included; every later cell ran
        assert outcome(forked[name]) == outcome(execed[name]), name
        assert forked[name]["process_start"] == "fork" and execed[name]["process_start"] == "exec", name
    assert forked["hang"]["status"] == "timeout" and forked["segv"]["signature"] == "signal_SIGSEGV"
    assert "template process" not in output, "no fallback: the template served every cell"
    wait_until_gone(tmp_path / "forked")


def test_a_template_whose_imports_fail_falls_back_and_the_cell_records_the_error(cases_dir, tmp_path):
    for i in range(2):
        write_case(cases_dir, f"{i}-ok", {"model": "llama", "gpus": ["cpu-avx512"], "timeout_s": 10})
    records, output = run_faults(cases_dir, tmp_path / "run", "worker", "template", FAKE_TEMPLATE="broken")
    for record in records.values():
        assert record["process_start"] == "exec" and record["status"] == "crash"
        assert record["phase"] == "import" and record["exception"]["type"] == "ModuleNotFoundError"
    assert output.count("the imports failed: ModuleNotFoundError") == 1, output


def test_a_template_with_another_thread_refuses_to_fork(cases_dir, tmp_path):
    write_case(cases_dir, "0-ok", {"model": "llama", "gpus": ["cpu-avx512"], "timeout_s": 10})
    records, output = run_faults(cases_dir, tmp_path / "run", "process", "template", FAKE_TEMPLATE="thread")
    assert records["ok"]["process_start"] == "exec" and records["ok"]["verdict"] == "pass"
    assert "2 Python threads alive" in output


def slow_run(cases_dir: Path, run: Path, jobs: int, isolation: str, sleep_s: int,
             started: Callable[[Path], bool]) -> subprocess.Popen:
    """A harness forking four slow fake cells from the fake template, once `started(run)` holds."""
    write_case(cases_dir, "slow", {"model": "llama", "gpus": ["cpu-avx512"], "timeout_s": 3 * sleep_s,
                                   "matrix": {"kv_cache_dtype": ["auto", "bfloat16", "fp8", "fp8_e5m2"]}})
    harness = subprocess.Popen([*FAULT_RUN, str(cases_dir), str(run), str(jobs), isolation, "template"],
                               env={**ENV, "FAKE_CELL_SLEEP": str(sleep_s)}, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not started(run):
        assert time.monotonic() < deadline and harness.poll() is None
        time.sleep(0.1)
    return harness


def test_a_template_killed_mid_run_falls_back(cases_dir, tmp_path):
    run = tmp_path / "run"
    harness = slow_run(cases_dir, run, 1, "process", 2, lambda run: bool(RunDir(run).records()))
    time.sleep(0.5)  # the second cell is running in its forked child
    (template,) = [pid for pid in processes_of_run(run) if parent_of(pid) == harness.pid]
    os.kill(template, signal.SIGKILL)
    output, _ = harness.communicate(timeout=120)
    assert harness.returncode == 0
    records = RunDir(run).records()
    # The cell that lost its template with it ran again as a process of its own; so did every cell after it.
    assert [r["verdict"] for r in records] == ["pass"] * 4
    assert sorted(r["process_start"] for r in records) == ["exec", "exec", "exec", "fork"]
    assert output.count(f"the template process {template} ended") == 1, output
    wait_until_gone(run)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_run_leaves_no_template_or_child(cases_dir, tmp_path, stop):
    run = tmp_path / "run"
    # Once the template and two forked workers, each in a cell, are alive.
    harness = slow_run(cases_dir, run, 2, "worker", 10, lambda run: len(processes_of_run(run)) >= 3)
    harness.send_signal(stop)
    harness.wait(timeout=60)
    wait_until_gone(run)  # a killed harness's template dies with it (its parent-death signal), its children too


def test_the_protocol_reports_a_childs_end_as_popen_does(tmp_path):
    templates = Templates(FAKE_TEMPLATE, tmp_path / "logs", say=lambda line: pytest.fail(line))
    processes = CellProcesses()
    work = tmp_path / "work"
    work.mkdir()
    env = {**ENV, "OMP_NUM_THREADS": "1"}
    key = ShareKey(tuple(sorted(env.items())), (), None)
    try:
        for behaviour, code in (("ok", 0), ("crash", 1), ("segv", -signal.SIGSEGV)):
            spec = work / f"{behaviour}.spec.json"
            spec.write_text(f'{{"cell_id": "{behaviour}[kv=auto]", "engine_args": {{}}}}')
            files = CellFiles(spec, work / f"{behaviour}.result.json", work / f"{behaviour}.log")
            started = templates.cell(FAKE_CELL, files, env, key, processes, None)
            assert started.how == "fork" and started.proc.wait(timeout=30) == code, behaviour
            assert f"fake cell {behaviour}" in files.log.read_text()
        hang = work / "hang.spec.json"
        hang.write_text('{"cell_id": "hang[kv=auto]", "engine_args": {}}')
        started = templates.cell(FAKE_CELL, CellFiles(hang, work / "hang.result.json", work / "hang.log"),
                                 {**env, "OMP_NUM_THREADS": "2"}, key, processes, None)
        with pytest.raises(subprocess.TimeoutExpired):
            started.proc.wait(timeout=0.5)
        os.killpg(started.proc.pid, signal.SIGKILL)
        assert started.proc.wait(timeout=30) == -signal.SIGKILL
        assert len(templates._templates) == 1, "a slot's own threads and cores do not need a template of their own"
    finally:
        templates.close()


def test_a_template_key_leaves_out_what_a_child_sets_itself():
    env = (("OMP_NUM_THREADS", "1"), ("PATH", "/bin"), (CPU_THREADS_BIND_ENV, "0-0"))
    assert template_key(ShareKey(env, (8, 9), None)) == ShareKey((("PATH", "/bin"),), (8, 9), None)


READS_DURING_IMPORTS = """
import json, os
read = set()

class Recording(type(os.environ)):
    def __getitem__(self, key):
        read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        read.add(key)
        return super().__contains__(key)

os.environ.__class__ = Recording
from kvmatrix.harness.cell.template_server import _import_for_cells
_import_for_cells({"capability": None, "cpu_isa": None})
print(json.dumps(sorted(k for k in read if isinstance(k, str))))
"""


@pytest.mark.vllm
def test_the_variables_a_forked_cell_sets_are_read_by_none_of_the_templates_imports():
    # A variable read while the template imports would keep the template's value in every child forked from it.
    done = subprocess.run([sys.executable, "-c", READS_DURING_IMPORTS], env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    read = set(json.loads(done.stdout.splitlines()[-1]))
    assert "VLLM_TARGET_DEVICE" in read, "the recording sees vLLM's reads"
    assert read & set(READ_BY_ENGINE_ENV) == set()
