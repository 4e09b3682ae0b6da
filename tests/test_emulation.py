"""Emulated classes: a cell the real card cannot execute is `not emulable` (a skip), never a failure; on a real card
of that class the same missing kernel library is the install's fault: an error, never a FAIL."""

from __future__ import annotations

from kvmatrix.harness.judge.outcome import classify_outcome
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.runner import finish
from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.load import CASES_DIR, load_case, load_models, load_pool

POOL = load_pool()
CUTLASS_LOG = "Traceback ...\nModuleNotFoundError: No module named 'cutlass'\n"


def finished(gpu: str, emulated_from: str | None) -> dict:
    (cell, *_) = expand_case(load_case(CASES_DIR / "deepseek-mla.yaml"), load_models(), POOL)
    settings = RunSettings(run_dir=RunDir("/nonexistent"), models={}, built={}, vllm_version="0.26.0",
                           cache_dir=None)
    result = {"status": "crash", "phase": "init", "vllm_version": "0.26.0",
              "exception": {"type": "ModuleNotFoundError", "message": "No module named 'cutlass'"}}
    record = {"cell_id": cell.cell_id}
    return finish(record, Task(cell, gpu, POOL[gpu], emulated_from), settings,
                   classify_outcome(1, False, 600, result, CUTLASS_LOG), 0.0)


def test_missing_kernels_of_the_emulated_class_are_not_emulable():
    record = finished("B200", "H200")
    assert record["signature"] == "cutlass_missing"
    assert record["verdict"] == "skip" and record["not_emulable"] is True
    assert record["reason"].startswith("not emulable on H200: ModuleNotFoundError: No module named 'cutlass'")


def test_the_same_failure_on_a_real_card_is_the_environments():
    record = finished("B200", None)
    assert record["verdict"] == "error" and "not_emulable" not in record
    assert record["reason"].startswith("environment, not vLLM: ModuleNotFoundError: No module named 'cutlass'")
