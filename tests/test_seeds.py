"""The regressions this project exists for, put back into the installed vLLM one line each (tests/patched_vllm/),
flip the right cells on every x86 CPU class this machine can run (itself, and each lower class emulated), with a
reason that names the broken rule, in the report too. Seed A: a checkpoint's kv_cache_scheme wins over an explicit
dtype (regression 1). Seed B: MLA layers ignore --kv-cache-dtype-skip-layers (regression 2)."""

from __future__ import annotations

import json
import os
import platform

import pytest

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.vllm_compat import detect_cpu_isa, installed_vllm_version
from kvmatrix.matrix.schema import X86_CPU_LEVELS
from tests.conftest import CPU_CLASS, FP8_KV_CPU_CLASSES
from tests.test_e2e import CT_OVERRIDE_PATCH, REPO, kvmatrix, record_file

pytestmark = pytest.mark.vllm

MLA_SKIP_IGNORED_PATCH = {
    "KVM_PATCH_MODULE": "vllm.model_executor.layers.attention.mla_attention",
    "KVM_PATCH_OLD": "if str(layer_idx) in cache_config.kv_cache_dtype_skip_layers:",
    "KVM_PATCH_NEW": "if False:",
}
SEED_A = ("ct-llama[kv=bfloat16,skip=-,spec=-]", CT_OVERRIDE_PATCH)
SEED_B = ("deepseek-mla[kv=fp8,skip=0,spec=-]", MLA_SKIP_IGNORED_PATCH)
HERE = detect_cpu_isa(platform.machine(), installed_vllm_version())


def x86_class(level: str):
    runnable = HERE in X86_CPU_LEVELS and X86_CPU_LEVELS.index(level) <= X86_CPU_LEVELS.index(HERE)
    return pytest.param(f"cpu-{level}", marks=pytest.mark.skipif(not runnable, reason=f"this CPU ({HERE}) "
                                                                 f"cannot run the {level} class"))


def expected_reason(seed: tuple, gpu: str) -> str:
    if seed is SEED_B:  # MLA starts with fp8 on every CPU class: the skipped layer is seen quantized
        return "model.layers.0.self_attn.attn: kv_cache_dtype is 'fp8', expected ['auto', 'bfloat16']"
    if gpu in FP8_KV_CPU_CLASSES:  # the explicit bfloat16 silently runs the checkpoint's fp8
        return "model.layers.0.self_attn.attn: kv_cache_dtype is 'fp8', expected 'bfloat16'"
    return "crash [cpu_fp8_kv_needs_avx512] NotImplementedError: FP8 KV cache"  # that fp8 refused at start


def as_patch(patch: dict) -> dict:
    """A KVM_PATCH_* patch as one entry of KVM_PATCHES (tests/patched_vllm/sitecustomize.py)."""
    return {"module": patch["KVM_PATCH_MODULE"], "old": patch["KVM_PATCH_OLD"], "new": patch["KVM_PATCH_NEW"]}


@pytest.mark.parametrize("gpu", [x86_class(level) for level in reversed(X86_CPU_LEVELS)])
def test_the_seeded_regressions_fail_their_cells_naming_the_rule(gpu, tmp_path):
    """Both seeds put back at once (their patches touch different modules, and neither model reads the other's
    line) and both cells in one run of the class: one `kvmatrix run` a class instead of one a seed. Each cell is
    still its own fresh process (`--isolation process`), so neither sees the other's engine."""
    env = {"PYTHONPATH": f"{REPO / 'tests' / 'patched_vllm'}{os.pathsep}{REPO}",
           "KVM_PATCHES": json.dumps([as_patch(patch) for _, patch in (SEED_A, SEED_B)])}
    emulate = ["--emulate"] if gpu != CPU_CLASS else []
    done = kvmatrix(tmp_path, "--gpu", gpu, *emulate, "--cell", SEED_A[0], "--cell", SEED_B[0], "--run-id", "seeded",
                    "--isolation", "process", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    run = tmp_path / "runs" / "seeded"
    records = {r["cell_id"]: r for r in RunDir(run).records()}
    assert sorted(records) == sorted([SEED_A[0], SEED_B[0]])
    report = (run / "matrix.md").read_text()
    for seed in (SEED_A, SEED_B):
        record, reason = records[seed[0]], expected_reason(seed, gpu)
        assert (record["gpu_class"], record["verdict"]) == (gpu, "fail")
        assert record["reason"].startswith(reason), record["reason"]
        # The report names the cell, its class and the broken rule; the record file keeps the verdict.
        assert f"**FAIL** `{seed[0]}` on {gpu}: {reason}" in report
        assert json.loads((run / record_file(record)).read_text())["verdict"] == "fail"
