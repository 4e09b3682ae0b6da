# What the package exports, once: mypy reads these types, and __init__.py loads each submodule when one of its
# names is first read (lazy_loader.attach_stub), so a command loads only the tables it uses. Each name is re-exported
# `as` itself, one block a submodule (isort would split them a line each).
# ruff: noqa: I001
from .emulation import (
    CPU_ISA_PROBE_MODULE as CPU_ISA_PROBE_MODULE,
    CPU_ISA_PROBES as CPU_ISA_PROBES,
    CUDA_PLATFORM_MODULE as CUDA_PLATFORM_MODULE,
    DEVICE_CAPABILITY_CLASS as DEVICE_CAPABILITY_CLASS,
    detect_cpu_isa as detect_cpu_isa,
    emulate_cpu_isa as emulate_cpu_isa,
    emulate_device_capability as emulate_device_capability,
    reported_capability as reported_capability,
)
from .engine import (
    ATTN_GROUPS_PATHS as ATTN_GROUPS_PATHS,
    BACKEND_REPLACED_LOG as BACKEND_REPLACED_LOG,
    BUILDER_DTYPE_ATTRS as BUILDER_DTYPE_ATTRS,
    DRAFT_LAYER_NAME_PATHS as DRAFT_LAYER_NAME_PATHS,
    DRAFT_METHODS_NEEDING_WEIGHTS as DRAFT_METHODS_NEEDING_WEIGHTS,
    FORWARD_CONTEXT_PATHS as FORWARD_CONTEXT_PATHS,
    KV_CACHE_CONFIG_PATHS as KV_CACHE_CONFIG_PATHS,
    KV_SPEC_FIELDS as KV_SPEC_FIELDS,
    LAYER_BACKEND_ATTRS as LAYER_BACKEND_ATTRS,
    LAYER_BACKEND_CALLS as LAYER_BACKEND_CALLS,
    LAYER_MARKER_ATTR as LAYER_MARKER_ATTR,
    LAYER_SCALE_ATTRS as LAYER_SCALE_ATTRS,
    MODEL_RUNNER_PATHS as MODEL_RUNNER_PATHS,
    PER_LAYER_SPECS_ATTR as PER_LAYER_SPECS_ATTR,
    PROBE_ONLY_ARG_NAMES as PROBE_ONLY_ARG_NAMES,
    SMALLEST_KV_BLOCK_TOKENS as SMALLEST_KV_BLOCK_TOKENS,
    TARGET_MODEL_CALLS as TARGET_MODEL_CALLS,
    TARGET_MODEL_PATHS as TARGET_MODEL_PATHS,
    VLLM_LOGGER as VLLM_LOGGER,
    probe_only_engine_args as probe_only_engine_args,
)
from .execution import (
    COMPILATION_MODE_KEYS as COMPILATION_MODE_KEYS,
    EXECUTIONS as EXECUTIONS,
    GRAPH_EXECUTIONS as GRAPH_EXECUTIONS,
    PREEMPTION_METRICS as PREEMPTION_METRICS,
    RUNTIME_CONFIG_PATHS as RUNTIME_CONFIG_PATHS,
    TINY_CAPTURE_SIZES as TINY_CAPTURE_SIZES,
    execution_engine_args as execution_engine_args,
)
from .findings import (
    FINDING_SIGNATURES as FINDING_SIGNATURES,
    FindingSignature as FindingSignature,
)
from .kernels import (
    JIT_PER_KV_DTYPE_BACKENDS as JIT_PER_KV_DTYPE_BACKENDS,
    compiles_per_kv_dtype as compiles_per_kv_dtype,
)
from .modules import (
    ATTN_GROUP_MODULE_FIELDS as ATTN_GROUP_MODULE_FIELDS,
    BACKEND_MODULES as BACKEND_MODULES,
    BUILDER_MODULE_FIELD as BUILDER_MODULE_FIELD,
    BUILDER_MODULES as BUILDER_MODULES,
    KV_GROUP_MODULE_FIELDS as KV_GROUP_MODULE_FIELDS,
    LAYER_MODULE_FIELDS as LAYER_MODULE_FIELDS,
    LAYER_QUANT_METHOD_ATTRS as LAYER_QUANT_METHOD_ATTRS,
    SELECT_ALL_PATHS as SELECT_ALL_PATHS,
    SPEC_MODULE as SPEC_MODULE,
    backend_module as backend_module,
    builder_module as builder_module,
    class_module as class_module,
    recorded_modules as recorded_modules,
    select_all_reason as select_all_reason,
    traceback_modules as traceback_modules,
)
from .phase_log import (
    engine_phases as engine_phases,
    forget_logged_once as forget_logged_once,
)
from .preimport import (
    AFTER_IMPORT_ENV as AFTER_IMPORT_ENV,
    ENGINE_MODULES as ENGINE_MODULES,
    READ_BY_ENGINE_ENV as READ_BY_ENGINE_ENV,
)
from .records import (
    BUILDER_FIELD_ALIASES as BUILDER_FIELD_ALIASES,
    QUERY_DTYPE_FIELDS as QUERY_DTYPE_FIELDS,
    normalized_builder as normalized_builder,
    normalized_record as normalized_record,
)
from .registry import (
    MODEL_INFO_CHILD_PROCESS as MODEL_INFO_CHILD_PROCESS,
    model_info_in_process as model_info_in_process,
)
from .signatures import (
    ENGINE_DEATH_WRAPPER as ENGINE_DEATH_WRAPPER,
    ENVIRONMENT_SIGNATURES as ENVIRONMENT_SIGNATURES,
    NOT_EMULABLE_SIGNATURES as NOT_EMULABLE_SIGNATURES,
    PLATFORM_REFUSALS as PLATFORM_REFUSALS,
    SIGNATURE_FAMILIES as SIGNATURE_FAMILIES,
    SIGNATURES as SIGNATURES,
    signature_matches as signature_matches,
)
from .sources import (
    BOUNDARY_KEPT_KV_DTYPES as BOUNDARY_KEPT_KV_DTYPES,
    BROKEN_WHEN_EMPTY_ENV as BROKEN_WHEN_EMPTY_ENV,
    CACHE_DTYPE_SOURCES as CACHE_DTYPE_SOURCES,
    CPU_THREADS_BIND_ENV as CPU_THREADS_BIND_ENV,
    ENGINE_ARGS_SOURCES as ENGINE_ARGS_SOURCES,
    ENV_SOURCES as ENV_SOURCES,
    HARNESS_OWNED_ENV as HARNESS_OWNED_ENV,
    IN_PROCESS_ENGINE_ENV as IN_PROCESS_ENGINE_ENV,
    MULTI_RANK_ENV as MULTI_RANK_ENV,
    VLLM_CACHE_ENV as VLLM_CACHE_ENV,
    boundary_keeps_every_layer as boundary_keeps_every_layer,
    known_engine_args as known_engine_args,
    known_env_vars as known_env_vars,
    known_kv_cache_dtypes as known_kv_cache_dtypes,
    skip_layer_words as skip_layer_words,
    vendored_pynvml as vendored_pynvml,
)
from .speculative import (
    SPEC_DECODE_METRICS as SPEC_DECODE_METRICS,
    SPECULATIVE_CONFIG_FIELDS as SPECULATIVE_CONFIG_FIELDS,
    missing_speculative_fields as missing_speculative_fields,
    speculative_config_fields as speculative_config_fields,
)
from .teardown import (
    CUDA_ERROR_MARKERS as CUDA_ERROR_MARKERS,
    TEARDOWN_CALLS as TEARDOWN_CALLS,
    cuda_error_in as cuda_error_in,
    gpu_memory_left_mib as gpu_memory_left_mib,
    retire_reason as retire_reason,
    teardown_engine as teardown_engine,
)
from .versions import (
    VLLM_DISTRIBUTIONS as VLLM_DISTRIBUTIONS,
    for_version as for_version,
    installed_vllm_distribution as installed_vllm_distribution,
    installed_vllm_version as installed_vllm_version,
    release_tuple as release_tuple,
    version_matches as version_matches,
)
