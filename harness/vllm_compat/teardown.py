"""Between two cells of one warm worker: how vLLM's process-wide state is torn down after an engine, and which
failures leave a process unfit for another cell (the worker then retires and a fresh one takes its slot)."""

from __future__ import annotations

import importlib

from kvmatrix.harness.record.types import CellOutput
from kvmatrix.harness.vllm_compat.versions import for_version

# Destroys the model-parallel groups and the distributed environment, unfreezes the objects vLLM froze out of the
# garbage collector after start-up, collects them (the one gc.collect a cell's teardown pays) and empties the
# accelerator's caches (parallel_state.py, 0.22 to 0.33). It also drops vLLM's cache of environment variables, so
# the next engine reads them afresh.
TEARDOWN_CALLS = [("", ("vllm.distributed.parallel_state", "cleanup_dist_env_and_memory"))]

# A CUDA error leaves the process's CUDA context unusable or suspect: no later cell in it can be trusted.
CUDA_ERROR_MARKERS = ("CUDA error", "cudaError", "CUBLAS_STATUS_", "CUDNN_STATUS_", "illegal memory access",
                      "device-side assert", "AcceleratorError", "NCCL error")
# What torch's allocator may still reserve after teardown before the worker retires. Kernel libraries keep their
# workspaces for the process's life (FlashInfer's, FlashMLA's, DeepGEMM's: 0.5-1.7 GiB after a cell on the H200
# with vLLM 0.26.0, where retiring at 512 MiB restarted a worker after nearly every sparse-MLA cell; with 0.34.0,
# 1.3-2.7 GiB, and 6.0-6.1 GiB after glm5-fp8's FP8 cells, which at a 4 GiB cap retired their worker after each
# of them: a new worker's first engine costs 40-50 s against 3 s warm). What a worker keeps never changes a later
# cell's state: every GPU class sizes the KV cache explicitly (kv_cache_memory_bytes in cases/_pool.yaml), so vLLM
# profiles no free memory. The cap bounds what buffers that outlived their engine can add up to, within a packed
# slot's share of the GPU (harness/run/host/slots.py).
MEMORY_KEPT_CAP_MIB = 7168


def teardown_engine() -> None:
    import torch
    import vllm

    # torch.compile's per-process caches: the next engine compiles its own graphs (and never runs eager because
    # earlier cells used up the recompile limit of a shared code object). Dropped before vLLM's teardown, whose one
    # collection then frees them with the engine: each full collection of a worker's heap (800,000 objects with
    # torch and vLLM imported) takes 0.5 s on the 2-core CPU, once per cell.
    torch._dynamo.reset()
    module, name = for_version(TEARDOWN_CALLS, vllm.__version__)[0]
    getattr(importlib.import_module(module), name)()


def gpu_memory_left_mib() -> float:
    """What torch's CUDA allocator still reserves in this process (0 on a process that never touched CUDA)."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return 0.0
    return torch.cuda.memory_reserved() / 2**20


def cuda_error_in(result: CellOutput) -> str | None:
    """The cell's exception, if it is a CUDA error: why its process must not run another cell."""
    exception = result.get("exception") or {}
    text = f"{exception.get('message') or ''}\n{exception.get('traceback_tail') or ''}"
    marker = next((m for m in CUDA_ERROR_MARKERS if m in text), None)
    return f"CUDA error in the cell ({marker})" if marker else None


def compilation_dropped(result: CellOutput) -> str | None:
    """Why a process whose cell asked for torch.compile and ran without it must not run another: on vLLM 0.33.0 on
    the H200 (2026-12-02) every later compiled cell of such a warm worker ran eager too, while each ran compiled in
    a fresh process. Process state from an earlier cell decided it, so no later cell of that worker can be trusted
    to run in its mode."""
    asked, runtime = result.get("engine_args") or {}, result.get("runtime")
    if runtime and asked.get("enforce_eager") is False and runtime.get("compilation_mode") in (None, "NONE"):
        return "torch.compile asked, vLLM ran the cell without it (compilation NONE)"
    return None


def retire_reason(result: CellOutput) -> str | None:
    """Why the process that produced this cell result must not run another cell; None when it may."""
    if reason := cuda_error_in(result) or compilation_dropped(result):
        return reason
    left = gpu_memory_left_mib()
    if left > MEMORY_KEPT_CAP_MIB:
        return f"{left:.0f} MiB of GPU memory still reserved after teardown (at most {MEMORY_KEPT_CAP_MIB} kept)"
    return None
