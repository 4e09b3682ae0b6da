"""The GPU paths, unit-tested on records captured on the lent H200 with vLLM 0.26.0 (real H200, and L4 / B200
emulated on it): tests/fixtures/records/h200-vllm-0.26.0/<class>--<cell id>.json."""

from __future__ import annotations

import json

import pytest

from harness.verdict import judge
from matrix.expand import expand_all
from matrix.load import load_cases, load_models, load_pool
from reports.markdown import class_differences
from reports.summary import facts
from tests.conftest import FIXTURES

GPU_RECORDS = FIXTURES / "records" / "h200-vllm-0.26.0"
POOL = load_pool()
CELLS = {c.cell_id: c for c in expand_all(load_cases(), load_models(), POOL)}


def captured(gpu: str, cell_id: str) -> dict:
    record = json.loads((GPU_RECORDS / f"{gpu}--{cell_id}.json").read_text())
    assert record["vllm_version"] == "0.26.0" and record["gpu_class"] == gpu
    return record


def judged_as(record: dict, gpu: str) -> tuple[str, str]:
    cell = CELLS[record["cell_id"]]
    verdict, reason, _ = judge(record, cell.case.expect, cell.context(gpu, POOL[gpu], "0.26.0", gpu != "H200"))
    return verdict, reason


@pytest.mark.parametrize("path", sorted(GPU_RECORDS.glob("*.json")), ids=lambda p: p.stem)
def test_captured_verdicts_hold_under_the_current_cases(path):
    record = json.loads(path.read_text())
    if record["verdict"] == "skip":
        assert record.get("not_emulable") and record["emulated_from"] == "H200"
        return
    assert judged_as(record, record["gpu_class"])[0] == record["verdict"], record["reason"]


def test_flashinfer_query_dtype_follows_class_and_group():
    """Regression 3: FP8 queries only for fp8 groups and only on SM90 / SM100; a skipped group keeps bf16."""
    cell = "flashinfer-qdtype[kv=fp8,skip=0,spec=-,attn=FLASHINFER]"
    q = {gpu: facts(captured(gpu, cell))["q"] for gpu in ("H200", "L4", "B200")}
    assert q == {"H200": "bfloat16,float8_e4m3fn/bfloat16", "L4": "bfloat16", "B200": "bfloat16,float8_e4m3fn"}


def test_fp8_queries_on_an_sm89_class_fail():
    """The H200's record (FP8 prefill queries) judged as an L4 cell: what the harness reports if vLLM regresses."""
    verdict, reason = judged_as(captured("H200", "flashinfer-qdtype[kv=fp8,skip=-,spec=-,attn=FLASHINFER]"), "L4")
    assert verdict == "fail"
    assert reason == "FLASHINFER builder (group 0): q_data_type_prefill is 'float8_e4m3fn', expected 'bfloat16'"


def test_mla_skip_layers_on_the_h200_and_emulated_l4():
    h200 = captured("H200", "deepseek-mla[kv=fp8,skip=0,spec=-]")
    assert (h200["verdict"], h200["signature"]) == ("fail", "no_common_block_size")
    l4 = captured("L4", "deepseek-mla[kv=fp8,skip=0,spec=-]")
    pages = {la["index"]: (la["kv_cache_dtype"], la["backend"], la["page_size_bytes"]) for la in l4["layers"]}
    assert pages[0] == ("auto", "TRITON_MLA", 36864) and pages[1] == ("fp8", "TRITON_MLA", 18432)


def test_draft_records_separately_from_target():
    record = captured("H200", "llama-dflash[kv=fp8,skip=4,spec=llama-dflash]")
    roles = {la["role"]: (la["kv_cache_dtype"], la["backend"]) for la in record["layers"]}
    assert roles == {"target": ("fp8", "FLASH_ATTN"), "draft": ("auto", "FLASH_ATTN")}


def test_class_differences_name_what_emulation_changed():
    records = [captured(g, "flashinfer-qdtype[kv=fp8,skip=-,spec=-,attn=FLASHINFER]") for g in ("H200", "L4")]
    assert class_differences(records, "H200") == [
        "- `flashinfer-qdtype[kv=fp8,skip=-,spec=-,attn=FLASHINFER]` H200 → L4: q float8_e4m3fn/bfloat16 → "
        "bfloat16; greedy output tokens changed"]
