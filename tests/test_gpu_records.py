"""The GPU paths, unit-tested on records captured on the lent H200 with vLLM 0.26.0 (real H200, and L4 / B200
emulated on it): tests/fixtures/records/h200-vllm-0.26.0/<class>--<cell id>.json."""

from __future__ import annotations

import json
import re

import pytest

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.verdict import judge
from kvmatrix.harness.record.neighbours import Neighbours
from kvmatrix.harness.record.task import Task
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import load_cases, load_models, load_pool
from kvmatrix.reports.markdown import class_differences
from kvmatrix.reports.summary import facts
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
    judged = judge(record, cell.case.expect, cell.context(gpu, POOL[gpu], "0.26.0", gpu != "H200"))
    return judged.verdict, judged.reason


@pytest.mark.parametrize("path", sorted(GPU_RECORDS.glob("*.json")), ids=lambda p: p.stem)
def test_captured_verdicts_hold_under_the_current_cases(path, tmp_path):
    record = json.loads(path.read_text())
    if record["verdict"] == "skip":
        assert record.get("not_emulable") and record["emulated_from"] == "H200"
    task = Task(CELLS[record["cell_id"]], record["gpu_class"], POOL[record["gpu_class"]], record["emulated_from"])
    again = judge_record(record, task, Neighbours())
    assert (again["verdict"], held(again["reason"])) == (record["verdict"], held(record["reason"]))


def held(reason: str) -> str:
    """A reason, where a pass counts its checks without the count: built-in rules added since the record was
    judged (a forced backend is the one that runs) add checks, not verdicts."""
    return re.sub(r"^\d+ checks hold", "checks hold", reason)


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


def test_sparse_mla_fp8_ds_mla_on_hopper_and_refused_on_sm89():
    """Class 7, sparse: fp8_ds_mla stores 656 bytes per token on FLASHMLA_SPARSE; a skipped layer runs the bf16
    sparse backend with its own page, in one group; an emulated L4 has no sparse MLA kernel and says so at start."""
    plain = captured("H200", "deepseek-v32-sparse-mla[kv=fp8_ds_mla,skip=-,spec=-]")
    assert {(la["backend"], la["spec_dtype"], la["page_size_bytes"]) for la in plain["layers"]} == {
        ("FLASHMLA_SPARSE", "uint8", 656 * 64)}
    skipped = captured("H200", "deepseek-v32-sparse-mla[kv=fp8_ds_mla,skip=0,spec=-]")
    layers = {la["index"]: (la["backend"], la["kv_cache_dtype"], la["page_size_bytes"]) for la in skipped["layers"]}
    assert layers[0] == ("FLASH_ATTN_MLA_SPARSE", "auto", 1152 * 128)
    assert layers[1] == ("FLASHMLA_SPARSE", "fp8_ds_mla", 656 * 128)
    l4 = captured("L4", "deepseek-v32-sparse-mla[kv=fp8_ds_mla,skip=-,spec=-]")
    assert (l4["verdict"], l4["signature"], l4["phase"]) == ("pass", "no_valid_backend", "init")


def test_sliding_window_layers_skipped_by_name_keep_one_page_size():
    """Class 8: sliding layers kept bf16 by `sliding_window`; the fp8 full-attention group doubles its block so
    that both groups share one page size."""
    record = captured("H200", "gemma3-sliding-skip[kv=fp8,skip=sliding_window,spec=-]")
    layers = {la["index"]: (la["kv_cache_dtype"], la["page_size_bytes"]) for la in record["layers"]}
    assert layers == {0: ("auto", 8192), 1: ("fp8", 8192), 2: ("auto", 8192), 3: ("fp8", 8192)}
    blocks = {g["spec_type"]: g["block_size"] for g in record["kv_groups"]}
    assert blocks == {"SlidingWindowSpec": 16, "FullAttentionSpec": 32}


def test_mamba_state_pins_the_hybrid_page():
    """Class 10: fp8 KV nearly doubles the attention block, but the page stays pinned by the Mamba state."""
    pages = {}
    for kv in ("auto", "fp8"):
        record = captured("H200", f"nemotron-h-hybrid[kv={kv},skip=-,spec=-]")
        pages[kv] = {g["spec_type"]: (g["block_size"], g["page_size_bytes"]) for g in record["kv_groups"]}
    assert pages == {"auto": {"MambaSpec": (256, 139264), "FullAttentionSpec": (272, 139264)},
                     "fp8": {"MambaSpec": (256, 135168), "FullAttentionSpec": (528, 135168)}}


def test_eagle3_draft_crash_is_named():
    record = captured("H200", "llama-eagle3[kv=fp8,skip=4,spec=llama-eagle3]")
    assert (record["verdict"], record["signature"]) == ("fail", "eagle3_aux_hidden_states_shape")


def test_a_packing_failure_is_an_error_not_a_vllm_failure():
    record = captured("H200", "gemma3-sliding-skip[kv=auto,skip=-,spec=-]")
    assert (record["verdict"], record["signature"]) == ("error", "startup_free_memory_check")
    assert record["reason"].startswith("environment, not vLLM: ValueError: Free memory on device cuda:0")


def test_older_architectures_run_fp8_on_a_dequantizing_backend():
    """Class 9 on emulated SM80 / SM86: fp8 and fp8_e5m2 run (FlashInfer with bf16 queries), skipped layers on
    FA2, a DFlash draft included; no kernel crash."""
    a100 = captured("A100", "fp8-older-archs[kv=fp8,skip=0+3,spec=llama-dflash]")
    by_role = {(la["role"], la["kv_cache_dtype"]): la["backend"] for la in a100["layers"]}
    assert by_role == {("target", "auto"): "FLASH_ATTN", ("target", "fp8"): "FLASHINFER",
                       ("draft", "fp8"): "FLASHINFER"}
    a10 = captured("A10", "fp8-older-archs[kv=fp8_e5m2,skip=-,spec=-]")
    assert (a10["verdict"], facts(a10)["backend"], facts(a10)["q"]) == ("pass", "FLASHINFER", "bfloat16")


def test_every_captured_cell_was_checked_back_at_its_gpu_baseline():
    records = [json.loads(p.read_text()) for p in GPU_RECORDS.glob("*.json")]
    checked = [r for r in records if "gpu_memory" in r]
    assert len(checked) >= 10  # the records captured after the check existed
    assert all(r["gpu_memory"]["gpu_index"] == 0 and r["gpu_memory"]["leaked_mib"] == 0 for r in checked)
    assert not any(r.get("leak") for r in records)
