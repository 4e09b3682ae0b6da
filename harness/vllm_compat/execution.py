"""Execution modes (the `execution` axis, matrix/axes.py) as each vLLM release's engine arguments, and where a
running engine says what it resolved for them and for the workloads' runtime paths.

- eager: `enforce_eager=True` (no torch.compile, no CUDA graphs): what every cell ran before the axis.
- compiled: torch.compile, no CUDA graphs (`cudagraph_mode: NONE`).
- graphs: vLLM's default, what users serve with: torch.compile and its default CUDA-graph mode
  (FULL_AND_PIECEWISE on the releases the harness runs), small capture sizes.
- graphs_piecewise / graphs_full: one CUDA-graph mode forced (PIECEWISE, FULL).

The compilation mode was called `level` (CompilationLevel.PIECEWISE = 3) until vLLM 0.11.1 renamed it `mode`
(CompilationMode.VLLM_COMPILE = 3, vllm-project/vllm#26355); both are ints in a `compilation_config` dict. On a
CPU vLLM turns VLLM_COMPILE into DYNAMO_TRACE_ONCE with inductor and empties the capture sizes
(vllm/platforms/cpu.py), so `compiled` there is Dynamo + inductor; CUDA graphs exist on CUDA only.
"""

from __future__ import annotations

from typing import Any

from kvmatrix.harness.vllm_compat.versions import for_version

# The compilation config's key for the compilation mode, and its value for vLLM's own torch.compile pipeline.
COMPILATION_MODE_KEYS = [(">=0.11.1", ("mode", 3)), ("<0.11.1", ("level", 3))]
# Capture sizes for tiny models: a handful of batch sizes instead of vLLM's up to 512 (each is a capture).
TINY_CAPTURE_SIZES = [1, 2, 4, 8]
# execution -> (enforce_eager, cudagraph_mode or None for vLLM's default, uses CUDA graphs)
EXECUTIONS: dict[str, tuple[bool, str | None, bool]] = {
    "eager": (True, None, False),
    "compiled": (False, "NONE", False),
    "graphs": (False, None, True),
    "graphs_piecewise": (False, "PIECEWISE", True),
    "graphs_full": (False, "FULL", True),
}
GRAPH_EXECUTIONS = frozenset(name for name, (_, _, graphs) in EXECUTIONS.items() if graphs)


def execution_engine_args(execution: str, version: str | None, base: dict[str, Any] | None = None
                          ) -> dict[str, Any]:
    """The engine arguments of one execution mode under vLLM `version`, merged over a `compilation_config` the
    case or model already sets (`base`)."""
    eager, cudagraph_mode, graphs = EXECUTIONS[execution]
    if eager:
        return {"enforce_eager": True}
    key, value = for_version(COMPILATION_MODE_KEYS, version)[0]
    config: dict[str, Any] = {**(base or {}), key: value}
    if cudagraph_mode is not None:
        config["cudagraph_mode"] = cudagraph_mode
    if graphs:
        config.setdefault("cudagraph_capture_sizes", list(TINY_CAPTURE_SIZES))
    return {"enforce_eager": False, "compilation_config": config}


# What the worker's engine resolved for the execution and the runtime paths: record field -> attribute path under
# the model runner (every release the harness runs).
RUNTIME_CONFIG_PATHS = [("", {
    "enforce_eager": "vllm_config.model_config.enforce_eager",
    "compilation_mode": "vllm_config.compilation_config.mode",
    "cudagraph_mode": "vllm_config.compilation_config.cudagraph_mode",
    "enable_prefix_caching": "vllm_config.cache_config.enable_prefix_caching",
    "enable_chunked_prefill": "vllm_config.scheduler_config.enable_chunked_prefill",
    "max_num_batched_tokens": "vllm_config.scheduler_config.max_num_batched_tokens",
    "max_num_seqs": "vllm_config.scheduler_config.max_num_seqs",
    "max_model_len": "vllm_config.model_config.max_model_len",
    "num_blocks": "kv_cache_config.num_blocks",
})]
# The engine metric that counts preempted requests (needs `disable_log_stats=False`), read with LLM.get_metrics().
PREEMPTION_METRICS = [("", "vllm:num_preemptions")]
