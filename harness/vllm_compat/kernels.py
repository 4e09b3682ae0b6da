"""Which attention backends compile their kernels while a cell runs, once per KV-cache dtype: what decides whether
two cold cells of one model that differ only in their KV dtype compile the same kernels
(harness/run/order/pilots.py)."""

from __future__ import annotations

from kvmatrix.harness.vllm_compat.versions import for_version

# Backends (vLLM's registry names) that build kernels at run time for the query and KV dtypes a cell asks for:
# FlashInfer's nvcc modules (on a cold H200 with vLLM 0.26.0, one Hopper prefill module per dtype, ~200 s each),
# Triton's kernels and FlexAttention's compiled graphs, which specialize on the cache dtype. The others ship
# their kernels prebuilt for every dtype (FlashAttention, FlashMLA, the CPU backends).
JIT_PER_KV_DTYPE_BACKENDS = [("", frozenset({"FLASHINFER", "FLASHINFER_MLA", "TRITON_ATTN", "TRITON_MLA",
                                              "FLEX_ATTENTION"}))]


def compiles_per_kv_dtype(backend: str, version: str | None = None) -> bool:
    """Whether `backend` (one name, or several joined by "/" for a cell whose layers use several) builds kernels
    per KV dtype at run time."""
    jit = for_version(JIT_PER_KV_DTYPE_BACKENDS, version)[0]
    return any(name in jit for name in backend.split("/"))
