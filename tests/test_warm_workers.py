"""Warm workers (`--isolation worker`): many cells per process, and a hard failure never costs more than its cell.

A segfault, a kill or a hang ends the worker: the cell gets its record and a fresh worker takes the slot. A CUDA
error retires the worker after its cell. Every cell a worker ran to anything but a pass runs again in a fresh
process, and that run is the record (the worker's run is kept beside it): the verdicts equal those of one process
per cell. The workers are the production worker loop (harness/cell/worker.py `serve`) running the misbehaving fake
cells (tests/fake_worker.py); what real vLLM cells give in both isolations is checked in test_isolation_equality.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kvmatrix.harness.judge.waivers import parse_waivers
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.executor.local import run_locally
from kvmatrix.harness.run.order.policy import PastRuns
from kvmatrix.harness.run.session import Session
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import load_cases, load_models, load_pool
from kvmatrix.reports import html, junit, markdown
from tests.conftest import write_case
from tests.fault_run import FAKE_CELL, FAKE_WORKER
from tests.test_faults import alive

REPO = Path(__file__).resolve().parent.parent
FAULT_RUN = [sys.executable, str(REPO / "tests" / "fault_run.py")]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
# In this order: the cells after a fault show whether the worker was replaced.
BEHAVIOURS = ["ok", "crash", "segv", "killed", "hang", "cudaerror", "orphan", "slow"]


def fault_cases(cases_dir: Path) -> None:
    for i, name in enumerate(BEHAVIOURS):
        # File names keep the order above (cases load sorted by file name).
        write_case(cases_dir, f"{i}-{name}", {"model": "llama", "gpus": ["cpu-avx512"], "timeout_s": 4})


def run_faults(cases_dir: Path, run: Path, isolation: str) -> dict[str, dict]:
    done = subprocess.run([*FAULT_RUN, str(cases_dir), str(run), "1", isolation], env={**ENV, "FAKE_CELL_SLEEP": "0"},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return {r["case"].split("-", 1)[1]: r for r in RunDir(run).records()}


def test_worker_faults_end_in_the_same_verdicts_as_fresh_processes(cases_dir, tmp_path):
    fault_cases(cases_dir)
    process = run_faults(cases_dir, tmp_path / "process", "process")
    worker = run_faults(cases_dir, tmp_path / "worker", "worker")
    assert set(worker) == set(BEHAVIOURS)
    for name in BEHAVIOURS:
        assert (worker[name]["verdict"], worker[name]["status"], worker[name].get("signature")) == (
            process[name]["verdict"], process[name]["status"], process[name].get("signature")), name

    # Passing cells stay in the warm workers; everything else was confirmed in a fresh process.
    ran_warm = {name for name, r in worker.items() if r["isolation"] == "worker"}
    assert ran_warm == {"ok", "orphan", "slow"}
    for name in ("crash", "segv", "killed", "hang", "cudaerror"):
        assert worker[name]["isolation"] == "process" and worker[name]["warm_attempt"]["worker"]["pid"] > 0, name
    warm = {name: worker[name]["warm_attempt"] for name in ("segv", "killed", "hang")}
    assert warm["segv"]["signature"] == "signal_SIGSEGV"
    assert warm["killed"]["status"] == "killed" and warm["hang"]["status"] == "timeout"
    assert "CUDA error" in worker["cudaerror"]["warm_attempt"]["worker"]["retired"]

    # A Python exception keeps the worker; one that died (segv, killed, hang) or retired (CUDA error) is never
    # used again: the next cell has a fresh worker.
    pids = [(worker[name].get("warm_attempt") or worker[name])["worker"]["pid"] for name in BEHAVIOURS]
    assert pids[0] == pids[1] == pids[2] and pids[-2] == pids[-1], pids
    for before, after in zip(pids[2:-2], pids[3:-1], strict=True):
        assert before != after, pids
    assert worker["segv"]["warm_attempt"]["worker"]["cells_before"] == 2
    assert worker["orphan"]["worker"]["cells_before"] == 0 and worker["slow"]["worker"]["cells_before"] == 1
    for name in BEHAVIOURS:
        assert not alive(int((worker[name].get("warm_attempt") or worker[name])["worker"]["pid"])), name

    # What a hard crash in a worker looks like in the reports.
    records = list(worker.values())
    report = markdown.render(records)
    assert "## Run again in a fresh process" in report
    assert (f"2-segv[kv=auto,skip=-,spec=-] on cpu-avx512: warm worker {pids[2]} (its cell 3) saw FAIL "
            "(signal_SIGSEGV); same in a fresh process") in report
    assert "run again in a fresh process: warm worker" in junit.render(records)
    assert 'class="rerun"' in html.render(records)


def test_killed_harness_leaves_no_worker_and_resumes(cases_dir, tmp_path):
    write_case(cases_dir, "slow", {"model": "llama", "gpus": ["cpu-avx512"], "timeout_s": 10,
                                   "matrix": {"kv_cache_dtype": ["auto", "bfloat16", "fp8", "fp8_e5m2"]}})
    run = tmp_path / "run"
    harness = subprocess.Popen([*FAULT_RUN, str(cases_dir), str(run), "1", "worker"],
                               env={**ENV, "FAKE_CELL_SLEEP": "3"}, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(RunDir(run).records()) < 2:
        assert time.monotonic() < deadline and harness.poll() is None
        time.sleep(0.1)
    harness.send_signal(signal.SIGKILL)
    harness.wait(timeout=30)
    before = {r["cell_id"]: r for r in RunDir(run).records()}
    (pid,) = {r["worker"]["pid"] for r in before.values()}
    deadline = time.monotonic() + 10
    while alive(pid):  # the worker dies with the harness (parent-death signal), even a SIGKILLed one
        assert time.monotonic() < deadline, "a killed harness must not leave its worker running"
        time.sleep(0.1)

    rerun = subprocess.run([*FAULT_RUN, str(cases_dir), str(run), "1", "worker"],
                           env={**ENV, "FAKE_CELL_SLEEP": "0"}, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    after = {r["cell_id"]: r for r in RunDir(run).records()}
    assert len(after) == 4 and rerun.stdout.count("resumed") == len(before)
    for cell_id, record in before.items():
        assert after[cell_id] == record, "finished cells are not run again"


def test_a_known_failure_starts_in_a_fresh_process_and_spares_the_worker(cases_dir, tmp_path):
    for i, name in enumerate(["ok", "segv", "slow", "crash"]):
        write_case(cases_dir, f"{i}-{name}", {"model": "llama", "gpus": ["cpu-avx512"], "timeout_s": 10})
    write_case(cases_dir, "4-crash", {"model": "llama", "gpus": ["cpu-avx512"], "timeout_s": 10, "expect": [
        {"crash": {"signature": "no_common_block_size", "link": "reports/findings/README.md#a-known-crash"}}]})
    pool, models = load_pool(cases_dir), load_models(cases_dir)
    waivers = parse_waivers("1-segv[*]  gpu=cpu-*  reports/findings/README.md#a-known-segv\n")
    settings = RunSettings(run_dir=RunDir(tmp_path / "run"), models=models, built={"llama": cases_dir},
                           vllm_version="fake", cache_dir=tmp_path / "cache", cell_command=FAKE_CELL,
                           isolation="worker", worker_command=FAKE_WORKER, waivers=waivers)
    cells = expand_all(load_cases(sorted(cases_dir.glob("[!_]*.yaml"))), models, pool)
    tasks = Session(settings, "cpu-avx512", pool["cpu-avx512"], None, pool).tasks(cells)
    last_verdicts = {"3-crash[kv=auto,skip=-,spec=-]": "fail"}
    by_case = {r["case"]: r for r in run_locally(tasks, settings, past=PastRuns(verdicts=last_verdicts))}
    records = {case.split("-", 1)[1]: r for case, r in by_case.items() if case != "4-crash"}
    # The waived segfault, the case's expected failure and last run's failure ran once, in a fresh process, and say why.
    assert records["segv"]["isolation"] == "process" and "warm_attempt" not in records["segv"]
    assert records["segv"]["fresh_first"] == "waived (reports/findings/README.md#a-known-segv)"
    assert records["segv"]["verdict"] == "xfail" and records["segv"]["signature"] == "signal_SIGSEGV"
    assert records["crash"]["fresh_first"] == "fail in the last run" and records["crash"]["verdict"] == "fail"
    expected = by_case["4-crash"]  # the case itself expects this failure on this class
    assert expected["fresh_first"] == "the case expects failure no_common_block_size"
    assert (expected["verdict"], expected["isolation"]) == ("xfail", "process")
    # The passing cells around them ran in one worker: the segfault never took it down.
    assert records["ok"]["worker"]["pid"] == records["slow"]["worker"]["pid"]
    assert records["slow"]["worker"]["cells_before"] == 1


def test_siblings_of_a_confirmed_expected_failure_stay_in_the_warm_worker(cases_dir, tmp_path):
    write_case(cases_dir, "0-ok", {"model": "llama", "gpus": ["cpu-avx512"], "timeout_s": 10})
    write_case(cases_dir, "1-crash", {"model": "llama", "gpus": ["cpu-avx512"], "timeout_s": 10,
                                      "matrix": {"kv_cache_dtype": ["auto", "bfloat16", "fp8"]}})
    write_case(cases_dir, "2-cudaerror", {"model": "llama", "gpus": ["cpu-avx512"], "timeout_s": 10,
                                          "matrix": {"kv_cache_dtype": ["auto", "bfloat16"]}})
    pool, models = load_pool(cases_dir), load_models(cases_dir)
    waivers = parse_waivers("1-crash[*]  gpu=cpu-*  reports/findings/README.md#a-known-crash\n"
                            "2-cudaerror[*]  gpu=cpu-*  reports/findings/README.md#a-known-cuda-error\n")
    settings = RunSettings(run_dir=RunDir(tmp_path / "run"), models=models, built={"llama": cases_dir},
                           vllm_version="fake", cache_dir=tmp_path / "cache", cell_command=FAKE_CELL,
                           isolation="worker", worker_command=FAKE_WORKER, waivers=waivers)
    cells = expand_all(load_cases(sorted(cases_dir.glob("[!_]*.yaml"))), models, pool)
    tasks = Session(settings, "cpu-avx512", pool["cpu-avx512"], None, pool).tasks(cells)
    records = {r["cell_id"]: r for r in run_locally(tasks, settings, jobs=2)}
    crash = [r for r in records.values() if r["case"] == "1-crash"]
    assert all(r["verdict"] == "xfail" and r["signature"] == "no_common_block_size" for r in crash)
    # The case's first cell confirmed the crash in a fresh process; its siblings waited for it, crashed alike in
    # a warm worker and were taken as they were, naming the confirmation.
    (first,) = [r for r in crash if r["isolation"] == "process"]
    assert first["fresh_first"].startswith("waived") and "confirmed_by" not in first
    siblings = [r for r in crash if r is not first]
    assert len(siblings) == 2
    for record in siblings:
        assert record["isolation"] == "worker" and record["confirmed_by"] == first["cell_id"]
        assert "warm_attempt" not in record and "fresh_first" not in record
    # A CUDA error retires its worker, and its verdict is never taken from a worker: confirmed each time.
    for record in (r for r in records.values() if r["case"] == "2-cudaerror"):
        assert record["isolation"] == "process" and "confirmed_by" not in record, record["cell_id"]


def test_a_slot_keeps_a_worker_per_environment_and_comes_back_to_it(cases_dir, tmp_path):
    # One slot, cells alternating between the default environment and a case's own `env:` (as glm5-fp8 sets
    # VLLM_USE_DEEP_GEMM=0): each environment has its worker, and coming back finds it still warm.
    for i, env in enumerate([{}, {"VLLM_USE_DEEP_GEMM": "0"}, {}, {"VLLM_USE_DEEP_GEMM": "0"}]):
        write_case(cases_dir, f"{i}-ok", {"model": "llama", "gpus": ["cpu-avx512"], "timeout_s": 10, "env": env})
    pool, models = load_pool(cases_dir), load_models(cases_dir)
    settings = RunSettings(run_dir=RunDir(tmp_path / "run"), models=models, built={"llama": cases_dir},
                           vllm_version="fake", cache_dir=tmp_path / "cache", cell_command=FAKE_CELL,
                           isolation="worker", worker_command=FAKE_WORKER)
    cells = expand_all(load_cases(sorted(cases_dir.glob("[!_]*.yaml"))), models, pool)
    tasks = Session(settings, "cpu-avx512", pool["cpu-avx512"], None, pool).tasks(cells)
    workers = [r["worker"] for r in run_locally(tasks, settings)]
    assert [w["pid"] for w in workers[2:]] == [w["pid"] for w in workers[:2]]
    assert workers[0]["pid"] != workers[1]["pid"]
    assert [w["cells_before"] for w in workers] == [0, 0, 1, 1]
    for worker in workers:
        assert not alive(int(worker["pid"])), "no worker outlives the run"
