"""What a template process (harness/cell/template_server.py) imports before it forks cells, and what a forked cell may
still set after those imports.

A process's first `vllm.LLM(...)` imports most of vLLM lazily (the entry points, the v1 engine, the CPU worker and
its model runner, transformers' tokenizers and, through them, sklearn): about 15 s of the first engine's 18 s on a
2-core CPU. A template imports them once, so every cell forked from it starts its engine at the engine's floor.
A module missing from a release only costs its cells that import again: the template refuses to start and its
cells start as processes of their own.
"""

from __future__ import annotations

from kvmatrix.harness.vllm_compat.sources import CPU_THREADS_BIND_ENV

# The modules the first CPU engine of a process imports (vLLM 0.32: `from vllm import LLM` resolves lazily).
ENGINE_MODULES = [("", (
    "vllm.entrypoints.llm",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.engine.core",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.attention.backends.cpu_attn",
    "vllm.model_executor.model_loader",
))]

# vLLM variables that none of the imports above reads: vLLM reads them through `vllm.envs` only as an engine
# starts, so a forked cell's own value is the one its engine sees (tests/test_templates.py checks this on the
# installed vLLM by recording every variable the template's imports read). The CPU worker's core binding, and
# glm5-fp8's VLLM_USE_DEEP_GEMM=0, which would otherwise need a template of its own (25 CPU-s on 2 cores).
READ_BY_ENGINE_ENV = (CPU_THREADS_BIND_ENV, "VLLM_USE_DEEP_GEMM")

# Variables a forked cell sets for itself after the template's imports: those vLLM reads as the engine starts, and
# OMP_NUM_THREADS, which torch's OpenMP runtime read when it loaded (the cell sets its thread count again). Every
# other variable is fixed before the imports: a cell forks only from a template started with the same values.
AFTER_IMPORT_ENV = ("OMP_NUM_THREADS", *READ_BY_ENGINE_ENV)
