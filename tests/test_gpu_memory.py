"""GPU memory is checked back at its baseline after each cell, and a cell that leaves memory behind is reported
(not killed, not failed). NVML is replaced by a fake that says what a GPU holds; the runner is the real one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.executor.local import run_locally
from kvmatrix.harness.run.host.gpu_memory import gpu_baselines, physical_index
from kvmatrix.harness.run.process.gpu_check import GPU_LEAK_TOLERANCE_MIB, check_gpu_memory, pinned_gpus
from kvmatrix.harness.run.process.groups import RUN_MARK_ENV, CellProcesses, run_mark_of
from kvmatrix.harness.run.session import Session
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import load_cases, load_models, load_pool
from kvmatrix.reports import html, junit, markdown
from tests.fault_run import FAKE_CELL
from tests.test_faults import alive, fault_cases

GONE_PID = 2**22 + 1  # above Linux's largest pid: never a live process


class FakeGpu:
    """GPU 0 with `used` MiB in use and `held` (pid → MiB) as its compute processes; both can change meanwhile."""

    def __init__(self, used: float = 600.0, held: dict[int, float] | None = None) -> None:
        self.used, self.held = used, dict(held or {})

    def used_mib(self, index: int) -> float:
        return self.used

    def processes(self, index: int) -> dict[int, float]:
        return dict(self.held)


@pytest.fixture
def other_cell():
    """A running process in a process group of its own, as another cell packed on the same GPU would be."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield proc.pid
    proc.kill()
    proc.wait()


def watched(gpu: FakeGpu) -> CellProcesses:
    return CellProcesses(gpu_baselines(gpu, {0}))


def test_clean_cell_is_not_delayed():
    gpu = FakeGpu(held={1: 300.0})  # an operator's process, there before the run
    processes = watched(gpu)
    gpu.used += 100  # the driver's wobble, within the tolerance
    started = time.monotonic()
    out = check_gpu_memory(gpu, 0, processes, settle_s=10)
    assert time.monotonic() - started < 0.2
    assert "leak" not in out
    assert out["gpu_memory"]["exclusive"] and out["gpu_memory"]["leaked_pids"] == {}


def test_memory_freed_while_settling_is_no_leak():
    class FreedOnSecondLook(FakeGpu):
        looks = 0

        def processes(self, index: int) -> dict[int, float]:
            self.looks += 1
            if self.looks > 2:  # the baseline's look, the first after the cell, then the driver has freed it
                self.used, self.held = 600.0, {}
            return dict(self.held)

    gpu = FreedOnSecondLook()
    processes = watched(gpu)
    gpu.used += 2048
    gpu.held = {GONE_PID: 2048.0}
    out = check_gpu_memory(gpu, 0, processes, settle_s=10)
    assert "leak" not in out and out["gpu_memory"]["waited_s"] < 2


def test_process_still_holding_memory_is_a_leak():
    gpu = FakeGpu()
    processes = watched(gpu)
    gpu.used += 1536
    gpu.held = {GONE_PID: 1536.0}
    out = check_gpu_memory(gpu, 0, processes, settle_s=0.6)
    assert out["leak"] == f"1 process still holds 1536 MiB on GPU 0 after the cell ended: pids {GONE_PID}"
    assert out["gpu_memory"]["leaked_pids"] == {str(GONE_PID): 1536.0}
    assert out["gpu_memory"]["leaked_mib"] == 1536.0


def test_packed_gpu_compares_processes_only(other_cell):
    gpu = FakeGpu()
    processes = watched(gpu)
    processes.add(other_cell, 0)
    gpu.used += 4096  # the other cell's, and more: the device's total is not comparable while it runs
    gpu.held = {other_cell: 2048.0}
    out = check_gpu_memory(gpu, 0, processes, settle_s=0.6)
    assert "leak" not in out and out["gpu_memory"]["exclusive"] is False

    gpu.held[GONE_PID] = 512.0
    out = check_gpu_memory(gpu, 0, processes, settle_s=0.6)
    assert out["gpu_memory"]["leaked_pids"] == {str(GONE_PID): 512.0}
    assert "pids " + str(GONE_PID) in out["leak"]


def test_another_runs_process_is_not_this_cells_leak(tmp_path):
    """A second harness run sharing the GPU (its processes' environment names another run folder): not a leak of
    this run's cell, and its memory makes the GPU's total incomparable (no driver-level leak either)."""
    env = {**os.environ, RUN_MARK_ENV: str(tmp_path / "other-run")}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)
    try:
        # On a loaded machine (CI with -n 2) the child's environment was once read before it showed the mark.
        deadline = time.monotonic() + 10
        while run_mark_of(proc.pid) != env[RUN_MARK_ENV] and time.monotonic() < deadline:
            time.sleep(0.05)
        gpu = FakeGpu()
        processes = CellProcesses(gpu_baselines(gpu, {0}), run_mark=str(tmp_path / "this-run"))
        gpu.used += 6000
        gpu.held = {proc.pid: 6000.0}
        out = check_gpu_memory(gpu, 0, processes, settle_s=0.6)
        assert "leak" not in out and out["gpu_memory"]["exclusive"] is False

        # The same process in this run's environment, once its cell is gone: a leak.
        processes.run_mark = str(tmp_path / "other-run")
        out = check_gpu_memory(gpu, 0, processes, settle_s=0.6)
        assert out["gpu_memory"]["leaked_pids"] == {str(proc.pid): 6000.0}
    finally:
        proc.kill()
        proc.wait()


def test_memory_above_baseline_without_process_is_driver_level():
    gpu = FakeGpu()
    processes = watched(gpu)
    gpu.used += GPU_LEAK_TOLERANCE_MIB + 768
    out = check_gpu_memory(gpu, 0, processes, settle_s=0.6)
    assert "driver-level" in out["leak"] and "1024 MiB" in out["leak"]
    assert out["gpu_memory"]["leaked_mib"] == GPU_LEAK_TOLERANCE_MIB + 768


def test_only_plain_index_pins_are_checked():
    assert [physical_index(p) for p in ("0", "3", "0,1", "GPU-6f1c", "", None)] == [0, 3, None, None, None, None]
    assert pinned_gpus(lambda slot: {"CUDA_VISIBLE_DEVICES": str(slot // 2)}, 4) == {0, 1}
    assert pinned_gpus(lambda slot: {}, 4) == set() and pinned_gpus(None, 4) == set()


def fake_cell_run(cases_dir: Path, run: Path, gpu: FakeGpu | None) -> dict[str, dict]:
    pool, models = load_pool(cases_dir), load_models(cases_dir)
    cells = expand_all(load_cases(sorted(cases_dir.glob("[!_]*.yaml"))), models, pool)
    settings = RunSettings(run_dir=RunDir(run), models=models, built={"llama": cases_dir}, vllm_version="fake",
                           cache_dir=run.parent / "cache", cell_command=FAKE_CELL, gpu_memory=gpu,
                           gpu_settle_s=1.0)
    tasks = Session(settings, "cpu-avx512", pool["cpu-avx512"], None, pool).tasks(cells)
    records = run_locally(tasks, settings, slot_env=lambda slot: {"CUDA_VISIBLE_DEVICES": "0"})
    return {r["case"]: r for r in records}


def test_process_escaping_the_cell_is_reported_not_killed(cases_dir, tmp_path):
    fault_cases(cases_dir, ["ok", "orphan", "escaped"])
    run = tmp_path / "run"

    class GrandchildrenHold(FakeGpu):
        """NVML's view when each fake cell's grandchild (its pid in a .pid file) holds 1 GiB while alive."""

        def processes(self, index: int) -> dict[int, float]:
            written = (p.read_text() for p in (run / "work").glob("*.pid"))
            return {int(pid): 1024.0 for pid in written if pid and alive(int(pid))}

    try:
        records = fake_cell_run(cases_dir, run, GrandchildrenHold())
        (pid_file,) = (run / "work").glob("cpu-avx512--escaped*.pid")
        escaped = int(pid_file.read_text())
        assert records["escaped"]["leak"] == (f"1 process still holds 1024 MiB on GPU 0 after the cell ended: "
                                              f"pids {escaped}")
        assert alive(escaped), "a leaked process is reported, never killed"
        assert records["escaped"]["verdict"] == "pass", "a leak leaves the cell's results standing"
        # Cells run in name order: these two ran after the leak, which is not theirs; the orphan stayed in its
        # cell's group, so it was killed with it and its memory is back.
        for case in ("ok", "orphan"):
            assert "leak" not in records[case] and records[case]["gpu_memory"]["leaked_mib"] == 0
    finally:
        for pid_file in (run / "work").glob("*.pid"):
            pid = int(pid_file.read_text())
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_no_checker_adds_nothing(cases_dir, tmp_path):
    fault_cases(cases_dir, ["ok"])
    (record,) = fake_cell_run(cases_dir, tmp_path / "run", None).values()
    assert "gpu_memory" not in record and "leak" not in record


def test_reports_show_leaks():
    leak = "1 process still holds 1024 MiB on GPU 0 after the cell ended: pids 4242"
    records = [{"cell_id": "c[kv=fp8]", "case": "c", "gpu_class": "H200", "verdict": "pass", "reason": "",
                "leak": leak},
               {"cell_id": "c[kv=auto]", "case": "c", "gpu_class": "H200", "verdict": "pass", "reason": ""}]
    text = markdown.render(records)
    assert "PASS · LEAK" in text
    assert f"- c[kv=fp8] on H200: {leak}" in text.split("## Leaks")[1]
    page = html.render(records)
    assert page.count(">LEAK</div>") == 1 and leak in page.split('id="leaks"')[1]
    case = ET.fromstring(junit.render(records)).find(".//testcase[@name='c[kv=fp8]']")
    assert case.find("properties/property[@name='gpu_leak']").get("value") == leak
    assert f"LEAK: {leak}" in case.find("system-out").text
    assert ET.fromstring(junit.render(records)).find(".//testcase[@name='c[kv=auto]']/properties") is None
