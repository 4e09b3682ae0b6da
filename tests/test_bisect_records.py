"""The MLA skip-layer cells bisected on the lent H200 over staged vLLM 0.25.0, 0.25.1 and 0.26.0 (real H200, and
L4 emulated on it), judged again from the captured step records:
tests/fixtures/bisect/h200-mla-skip/<vLLM>--<class>--<cell id>.json; `<vLLM>-without-fa2` are the first
L4 bisection's steps, whose 0.25.x installs were staged without FlashAttention-2 (reports/examples/
h200-bisect-mla-skip.md)."""

from __future__ import annotations

import json

import pytest

from kvmatrix.harness.bisect.step import judge_step
from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.outcome import reclassified
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.neighbours import Neighbours
from kvmatrix.harness.record.task import Task
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import load_cases, load_models, load_pool
from kvmatrix.reports.summary import facts
from tests.conftest import FIXTURES

STEPS = FIXTURES / "bisect" / "h200-mla-skip"
POOL = load_pool()
CELLS = {c.cell_id: c for c in expand_all(load_cases(), load_models(), POOL)}
MLA_SKIP = ["deepseek-mla[kv=fp8,skip=0,spec=-]", "glm-mla[kv=fp8,skip=0,spec=-]"]


def rejudged(label: str, gpu: str, cell_id: str, tmp_path) -> dict:
    """The step's record as the current signature table and cases judge it (bisection applies no waivers)."""
    record = json.loads((STEPS / f"{label}--{gpu}--{cell_id}.json").read_text())
    assert (record["vllm_version"], record["gpu_class"]) == (label.split("-")[0], gpu)
    task = Task(CELLS[cell_id], gpu, POOL[gpu], record.get("emulated_from"))
    return judge_record(reclassified(record, RunDir(tmp_path).log_tail(record)), task, Neighbours())


@pytest.mark.parametrize("cell_id", MLA_SKIP)
def test_before_0_26_mla_layers_ignore_the_skip_list_on_the_h200(cell_id, tmp_path):
    """Regression 2 on a real GPU: vLLM 0.25.0 quantizes the skipped MLA layer 0 like every other layer."""
    record = rejudged("0.25.0", "H200", cell_id, tmp_path)
    assert [layer["kv_cache_dtype"] for layer in record["layers"]] == ["fp8"] * 4
    assert record["verdict"] == "fail" and "model.layers.0" in record["reason"] and "'fp8'" in record["reason"]
    assert judge_step(record)[0] == "bad"


@pytest.mark.parametrize("version", ["0.25.0", "0.25.1"])
@pytest.mark.parametrize("cell_id", MLA_SKIP)
def test_before_0_26_the_emulated_l4_quantizes_the_skipped_mla_layer_too(version, cell_id, tmp_path):
    """The steps the L4 bisection called bad: the same wrong dtype as on the H200, on TRITON_MLA, one page size."""
    record = rejudged(version, "L4", cell_id, tmp_path)
    assert [layer["kv_cache_dtype"] for layer in record["layers"]] == ["fp8"] * 4
    assert record["verdict"] == "fail" and facts(record)["page"] == "18432"
    assert judge_step(record)[0] == "bad"


@pytest.mark.parametrize("cell_id", MLA_SKIP)
def test_0_26_honours_the_skip_list_and_pages_differ_where_the_class_can_run_it(cell_id, tmp_path):
    l4 = rejudged("0.26.0", "L4", cell_id, tmp_path)
    assert l4["verdict"] == "pass" and l4["emulated_from"] == "H200"
    assert [layer["kv_cache_dtype"] for layer in l4["layers"]] == ["auto", "fp8", "fp8", "fp8"]
    assert facts(l4)["page"] == "36864/18432"
    # On the H200 the same fix meets FlashMLA's block size: the engine refuses to start (a finding, waived).
    h200 = rejudged("0.26.0", "H200", cell_id, tmp_path)
    assert (h200["verdict"], h200["signature"]) == ("fail", "no_common_block_size")


@pytest.mark.parametrize("version", ["0.25.0", "0.25.1"])
@pytest.mark.parametrize("cell_id", MLA_SKIP)
def test_a_missing_compiled_library_is_the_environments_fault_not_a_bad_step(version, cell_id, tmp_path):
    """Staged without FlashAttention-2, vLLM 0.25.x's MLA prefill on an emulated L4 calls `_vllm_fa2_C` and dies:
    the record says so (an error, never a fail) and a bisection skips the step instead of calling it bad."""
    record = rejudged(f"{version}-without-fa2", "L4", cell_id, tmp_path)
    assert (record["verdict"], record["signature"]) == ("error", "compiled_library_missing")
    outcome, verdict, reason = judge_step(record)
    assert (outcome, verdict) == ("skip", "error") and "environment is incomplete" in reason
