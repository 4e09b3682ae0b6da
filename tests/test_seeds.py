"""The regressions this project exists for, put back into the installed vLLM one line each (tests/patched_vllm/),
flip the right cells on every x86 CPU class this machine can run (itself, and each lower class emulated), with a
reason that names the broken rule. Seed A: a checkpoint's kv_cache_scheme wins over an explicit dtype (regression
1). Seed B: MLA layers ignore --kv-cache-dtype-skip-layers (regression 2)."""

from __future__ import annotations

import os
import platform

import pytest

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.vllm_compat import detect_cpu_isa, installed_vllm_version
from kvmatrix.matrix.schema import X86_CPU_LEVELS
from tests.conftest import CPU_CLASS, FP8_KV_CPU_CLASSES
from tests.test_e2e import CT_OVERRIDE_PATCH, REPO, kvmatrix

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


@pytest.mark.parametrize("seed", [SEED_A, SEED_B], ids=["seed-A-explicit-dtype", "seed-B-mla-skip-layers"])
@pytest.mark.parametrize("gpu", [x86_class(level) for level in reversed(X86_CPU_LEVELS)])
def test_a_seeded_regression_fails_its_cell_naming_the_rule(seed, gpu, tmp_path):
    cell, patch = seed
    env = {"PYTHONPATH": f"{REPO / 'tests' / 'patched_vllm'}{os.pathsep}{REPO}", **patch}
    emulate = ["--emulate"] if gpu != CPU_CLASS else []
    done = kvmatrix(tmp_path, "--gpu", gpu, *emulate, "--cell", cell, "--run-id", "seeded", "--isolation",
                    "process", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    (record,) = RunDir(tmp_path / "runs" / "seeded").records()
    assert (record["gpu_class"], record["verdict"]) == (gpu, "fail")
    assert record["reason"].startswith(expected_reason(seed, gpu)), record["reason"]
