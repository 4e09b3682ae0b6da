"""Before an engine: how vLLM learns what a model class supports, and how a one-rank cell keeps that in its own
process.

vLLM inspects each model class it has not inspected yet (multimodal? attention-free? hybrid? ...) in a child Python
process, so that a parent which forks engine processes later has not initialized CUDA, and caches the answer
under VLLM_CACHE_ROOT/modelinfos, keyed by a hash of the model's source. On a cold cache every cell that starts
before the answer is cached pays that child's imports of torch and vLLM: 22-60 s per cell on a busy H200 with
vLLM 0.26.0 (about 780 s of a cold default run's 3313 s of cell time, and 26 s of the FlashInfer cells that end
the run). A cell with one rank builds its engine in its own process (IN_PROCESS_ENGINE_ENV) and forks no engine
process, so it runs the same inspection of the same class in-process; vLLM caches the answer as it would.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kvmatrix.harness.vllm_compat.versions import for_version

# The function vLLM hands the inspection to (registry.py, 0.20 to 0.32): it runs `fn` in a child process.
MODEL_INFO_CHILD_PROCESS = [("", ("vllm.model_executor.models.registry", "_run_in_subprocess"))]


def _in_this_process(fn: Callable[[], Any]) -> Any:
    return fn()


@contextmanager
def model_info_in_process(version: str | None) -> Iterator[bool]:
    """vLLM's model-class inspections run in this process while the block runs; yields whether they do (False:
    this vLLM has no such function, and inspects as it always does)."""
    module_name, name = for_version(MODEL_INFO_CHILD_PROCESS, version)[0]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        module = None
    original = getattr(module, name, None)
    if not callable(original):
        yield False
        return
    setattr(module, name, _in_this_process)
    try:
        yield True
    finally:
        setattr(module, name, original)
