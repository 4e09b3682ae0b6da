"""Accuracy cases: each cell's baseline derived from the axes, baselines run first, and the paired verdict."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvmatrix.harness.judge.accuracy import judge_accuracy
from kvmatrix.harness.judge.verdict import Judgement
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.order.baselines import baselines_first
from kvmatrix.harness.run.task.accuracy import offline_reason
from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.load import load_case, load_models, load_pool
from kvmatrix.matrix.schema import CaseError
from tests.conftest import shipped_matrix, write_case

ACCURACY = {"task": "tiny_reverse", "limit": 10, "max_drop": 0.05}


def cells_of(cases_dir, data):
    # On the CPU classes: a GPU class runs vLLM's default execution and would add each cell's eager oracle.
    path = write_case(cases_dir, "c", {"gpus": [{"device": "cpu"}], **data})
    return expand_case(load_case(path), load_models(cases_dir), load_pool(cases_dir), str(path))


def test_every_cell_is_compared_with_the_plain_auto_cell(cases_dir):
    cells = cells_of(cases_dir, {"model": "llama", "accuracy": ACCURACY, "matrix": {
        "kv_cache_dtype": ["auto", "fp8"], "kv_cache_dtype_skip_layers": [[], ["0"]],
        "attention_backend": [None, "FLASHINFER"]}})
    assert {c.baseline_id for c in cells} == {"c[kv=auto,skip=-,spec=-,attn=-]"}
    assert len(cells) == 8  # nothing added: the baseline is in the matrix


def test_a_missing_baseline_cell_is_added_first(cases_dir):
    cells = cells_of(cases_dir, {"model": "llama", "accuracy": ACCURACY,
                                 "matrix": {"kv_cache_dtype": ["fp8"], "speculative": ["llama-dflash"]}})
    # ... and the draft cell's no-draft twin after the case's own (the greedy-equality oracle)
    assert [c.cell_id for c in cells] == ["c[kv=auto,skip=-,spec=-]", "c[kv=fp8,skip=-,spec=llama-dflash]",
                                          "c[kv=fp8,skip=-,spec=-]"]
    assert cells[0].axes == {"kv_cache_dtype": "auto", "kv_cache_dtype_skip_layers": [], "speculative": None,
                             "draft_kv_cache_dtype": None, "draft_attention_backend": None,
                             "attention_backend": None, "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
                             "execution": "default", "workload": "plain"}


def test_a_checkpoint_with_fp8_kv_names_its_own_baseline_dtype(cases_dir):
    cells = cells_of(cases_dir, {"model": "ct-llama", "matrix": {"kv_cache_dtype": ["bfloat16", "auto"]},
                                 "accuracy": {**ACCURACY, "baseline_kv_cache_dtype": "bfloat16"}})
    assert [c.baseline_id for c in cells] == ["c[kv=bfloat16,skip=-,spec=-]"] * 2


def test_cases_without_accuracy_have_no_baseline(cases_dir):
    cells = cells_of(cases_dir, {"model": "llama", "matrix": {"kv_cache_dtype": ["fp8"]}})
    # The fp8 cell and the model reference it is compared with (bf16): neither has an accuracy baseline.
    assert [(c.cell_id, c.baseline_id) for c in cells] == [("c[kv=fp8,skip=-,spec=-]", None),
                                                           ("c[kv=bfloat16,skip=-,spec=-]", None)]


def test_accuracy_block_is_validated(cases_dir):
    with pytest.raises(CaseError, match="max_drop"):
        cells_of(cases_dir, {"model": "llama", "accuracy": {**ACCURACY, "max_drop": 2}})
    with pytest.raises(CaseError, match="expected_drops"):
        cells_of(cases_dir, {"model": "llama", "accuracy": {**ACCURACY, "expected_drops": [{"when": {"nope": 1},
                                                                                               "reason": "x"}]}})


def test_baselines_run_in_a_wave_before_the_others(cases_dir):
    cells = cells_of(cases_dir, {"model": "llama", "accuracy": ACCURACY, "matrix": {"kv_cache_dtype": ["fp8", "auto"]}})
    tasks = [SimpleNamespace(cell=c, gpu_name="cpu-avx512", key=c.cell_id) for c in cells]
    assert [[t.cell.cell_id for t in wave] for wave in baselines_first(tasks)] == [
        ["c[kv=auto,skip=-,spec=-]"], ["c[kv=fp8,skip=-,spec=-]"]]


@pytest.mark.parametrize("gpu", ["H200", "L4", "cpu-avx512"])
def test_no_cell_of_the_default_matrix_waits_for_a_cell_that_waits_for_it(gpu):
    """On a GPU class an accuracy baseline runs vLLM's default execution and is compared with its eager twin; the
    twin's own accuracy baseline is the eager twin of the baseline, not the baseline (vLLM 0.33.0 on the H200,
    2026-12-02: the two waited for each other, and the run ended without its accuracy cells)."""
    pool, cells, _ = shipped_matrix()
    tasks = [Task(c, gpu, pool[gpu], None) for c in cells.values() if gpu in c.gpu_classes]
    waves = [[t.cell.cell_id for t in wave] for wave in baselines_first(tasks)]
    where = {cell: i for i, wave in enumerate(waves) for cell in wave}
    assert sum(map(len, waves)) == len(tasks)
    if gpu != "cpu-avx512":
        eager = "trained-llama-accuracy[kv=auto,skip=-,spec=-,exec=eager]"
        assert cells["trained-llama-accuracy[kv=fp8,skip=-,spec=-,exec=eager]"].baseline_id == eager
        assert where[eager] < where["trained-llama-accuracy[kv=auto,skip=-,spec=-]"] \
            < where["trained-llama-accuracy[kv=fp8,skip=-,spec=-]"]


def test_hub_only_models_are_skipped_offline(cases_dir):
    models = load_models(cases_dir)
    (cell,) = cells_of(cases_dir, {"model": "llama", "accuracy": ACCURACY})
    (hub_only,) = cells_of(cases_dir, {"model": "llama-3-8b-instruct-full"})
    assert "needs hub access" in offline_reason(hub_only, models, use_hub=False)
    assert offline_reason(hub_only, models, use_hub=True) is None
    assert offline_reason(cell, models, use_hub=False) is None


# --- the verdict, on records shaped like the cell process writes them ------------------------------------------
def record(cell_id: str, samples: list[float], tokens: list[list[int]] | None = None) -> dict:
    n = len(samples)
    return {"cell_id": cell_id, "verdict": "pass", "accuracy": {
        "task": "t", "metric": "exact_match,none", "score": sum(samples) / n, "n": n, "doc_ids": list(range(n)),
        "samples": samples, "tokens": tokens or [[i] for i in range(n)]}}


def judged(cases_dir, cell_samples, baseline_samples, **accuracy):
    cells = cells_of(cases_dir, {"model": "llama", "matrix": {"kv_cache_dtype": ["auto", "fp8"]},
                                 "accuracy": {**ACCURACY, **accuracy}})
    baseline = None if baseline_samples is None else {**record(cells[0].cell_id, baseline_samples),
                                                      "gpu_class": "cpu-avx512"}
    mine = record(cells[1].cell_id, cell_samples)
    context = cells[1].context("cpu-avx512", load_pool(cases_dir)["cpu-avx512"], None, False)
    judgement = judge_accuracy(mine, Judgement("pass", "2 checks hold", []), cells[1], baseline, context)
    assert "accuracy_vs_baseline" not in mine, "the record judged is left as it was"
    return judgement.verdict, judgement.reason, judgement.fields, judgement.results


def test_a_significant_drop_beyond_the_allowed_one_fails(cases_dir):
    verdict, reason, mine, results = judged(cases_dir, [1.0] * 60 + [0.0] * 40, [1.0] * 100)
    assert verdict == "fail" and "significant accuracy drop" in reason and "n=100" in reason
    comparison = mine["accuracy_vs_baseline"]
    assert comparison["delta"] == pytest.approx(-0.4) and comparison["interval"][1] < 0
    assert results[-1]["ok"] is False


def test_a_drop_within_the_allowed_one_passes(cases_dir):
    verdict, _, mine, _ = judged(cases_dir, [1.0] * 60 + [0.0] * 40, [1.0] * 100, max_drop=0.5)
    assert verdict == "pass" and mine["accuracy_vs_baseline"]["significant"]


def test_an_expected_drop_is_xfail_and_its_absence_fails(cases_dir):
    expected = {"expected_drops": [{"when": {"kv_cache_dtype": "fp8"}, "reason": "scales off on purpose"}]}
    verdict, reason, *_ = judged(cases_dir, [0.0] * 100, [1.0] * 100, **expected)
    assert verdict == "xfail" and "scales off on purpose" in reason
    verdict, reason, *_ = judged(cases_dir, [1.0] * 100, [1.0] * 100, **expected)
    assert verdict == "fail" and reason.startswith("expected accuracy drop did not happen")


def test_no_baseline_record_is_reported_not_failed(cases_dir):
    verdict, reason, mine, _ = judged(cases_dir, [1.0] * 10, None)
    assert verdict == "pass" and mine["accuracy_vs_baseline"]["missing"] == "no baseline"
    assert reason.endswith("no baseline")


def test_a_baseline_of_another_mode_is_not_compared(cases_dir):
    """Like with like: a baseline that ran probe-only (fewer tokens) next to a full cell is a skipped comparison,
    never a drop."""
    cells = cells_of(cases_dir, {"model": "llama", "matrix": {"kv_cache_dtype": ["auto", "fp8"]},
                                 "accuracy": ACCURACY})
    baseline = {**record(cells[0].cell_id, [1.0] * 100), "gpu_class": "cpu-avx512", "mode": "probe"}
    mine = {**record(cells[1].cell_id, [0.0] * 100), "mode": "full"}
    context = cells[1].context("cpu-avx512", load_pool(cases_dir)["cpu-avx512"], None, False)
    judgement = judge_accuracy(mine, Judgement("pass", "2 checks hold", []), cells[1], baseline, context)
    assert judgement.verdict == "pass"
    assert judgement.fields["accuracy_vs_baseline"]["missing"] == ("not compared: the baseline ran in probe mode, "
                                                                   "this cell in full mode")
    assert judgement.reason.endswith("in full mode")
