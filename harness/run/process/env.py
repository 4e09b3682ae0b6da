"""A cell process's environment: the compile and JIT caches every cell of a run shares, the repository on its
PYTHONPATH, unbuffered output and Python's fault handler, and what the case and the slot add."""

from __future__ import annotations

import os
from pathlib import Path

from kvmatrix.harness.record.paths import import_root
from kvmatrix.harness.run.process.groups import RUN_MARK_ENV
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.vllm_compat import BROKEN_WHEN_EMPTY_ENV, IN_PROCESS_ENGINE_ENV, VLLM_CACHE_ENV

# Every JIT cache a cell may fill, in the run's cache folder: what one cell compiles serves every slot of the run
# and every later run on the machine. vLLM's own folder holds its torch.compile cache and AOT artefacts (each
# compile hash with its Inductor cache: vLLM points TORCHINDUCTOR_CACHE_DIR there itself) and DeepGEMM's JIT
# cache; FlashInfer's JIT modules and autotune results live under its workspace base; the CUDA driver's cache
# holds PTX compiled for this card (kernels shipped without its machine code). The CUTLASS DSL (sparse MLA's
# kernels on vLLM 0.33+) and TVM-FFI (FlashInfer 0.7's extension builds) otherwise compile into /tmp and ~/.cache,
# outside the folder a nightly keeps.
CACHE_ENV = (VLLM_CACHE_ENV, "FLASHINFER_WORKSPACE_BASE", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
             "CUDA_CACHE_PATH", "CUTE_DSL_CACHE_DIR", "TVM_FFI_CACHE_DIR")
CACHE_FOLDERS = ("vllm", "flashinfer", "inductor", "triton", "cuda", "cutlass-dsl", "tvm-ffi")


def shared_cache_env(cache_dir: Path) -> dict[str, str]:
    """Compile and JIT caches shared by every cell of a run: kernels one cell builds serve the next."""
    folders = dict(zip(CACHE_ENV, CACHE_FOLDERS, strict=True))
    return {var: str(cache_dir / sub) for var, sub in folders.items()}


def run_mark(settings: RunSettings) -> str:
    """What RUN_MARK_ENV says in this run's cells: its run folder, one per run even where runs share a machine."""
    return str(settings.run_dir.root.resolve())


def cell_env(settings: RunSettings, extra: dict[str, str] | None = None, key: str = "") -> dict[str, str]:
    env = dict(settings.environment)
    caches = settings.cache_dir / "fresh" / key if settings.fresh_caches else settings.cache_dir
    env.update(shared_cache_env(caches))
    env.update(IN_PROCESS_ENGINE_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    env[RUN_MARK_ENV] = run_mark(settings)
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault prints its Python frames: the crash fingerprint's site
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(import_root()), env.get("PYTHONPATH")]))
    for name in BROKEN_WHEN_EMPTY_ENV:
        if env.get(name) == "":
            del env[name]
    env.update(settings.env or {})
    env.update(extra or {})
    return env
