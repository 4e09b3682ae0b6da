"""Strict schemas for kvmatrix's data files: what they all share, and the two shared files themselves.

Validation is strict (unknown keys, wrong types, unknown dtype names are errors) and every error names the file,
the case and the field (CaseError), so that a typo in a nightly case file is found before any engine starts.
pydantic does the type work. Here: the error, the strict base model, the installed vLLM's vocabulary, the model
registry (`_models.yaml`) and the GPU pool (`_pool.yaml`). A case file's schema is matrix/case.py, built from
its axes (axes.py) and what it expects of its cells' records (expectations.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvmatrix.matrix.messages import EXCERPT_CHARS, excerpt, readable_problems


@dataclass(frozen=True)
class Vocabulary:
    """What the installed vLLM accepts, for checks no schema can make alone; an empty set is not checked
    (no vLLM installed)."""

    kv_cache_dtypes: frozenset[str] = frozenset()
    engine_args: frozenset[str] = frozenset()
    env_vars: frozenset[str] = frozenset()
    # The failure names a `crash:` / `refuse:` rule may use: the signatures and their families.
    signatures: frozenset[str] = frozenset()
    # The words a skip list may hold besides layer indices (vLLM ignores any other word silently).
    skip_layer_words: frozenset[str] = frozenset()
    # Every field of vLLM's speculative_config in any release the harness knows (a case's `speculative_config:` and
    # a registry draft's `config:` name only these: a name no release has is a typo, not a field to skip cells for).
    speculative_fields: frozenset[str] = frozenset()
    # Registry model name -> the attention layers its local build brings (a draft's own, numbered after its
    # target's); a model missing here is not checked.
    model_layers: Mapping[str, int] = field(default_factory=dict)


class CaseError(ValueError):
    """A data file that cannot be used, with where the problem is; `also`, the file's other problems found with
    it (said after it, so that one pass over a file shows every mistake)."""

    def __init__(self, file: str, case: str | None, field: str | None, message: str,
                 also: Sequence[CaseError] = ()):
        self.also = tuple(also)
        more = "; also: " + "; ".join(other.as_also() for other in self.also) if self.also else ""
        self.file, self.case, self.field = file, case, field
        self.message: str = message + more
        self._own = message
        super().__init__(located(file, case, field, self.message))

    def as_also(self) -> str:
        return f"field '{self.field}': {self.message}" if self.field else self.message

    def each(self) -> list[CaseError]:
        """Every problem, one CaseError each."""
        return [CaseError(self.file, self.case, self.field, self._own), *self.also]


def every_problem(problems: Sequence[CaseError]) -> CaseError:
    """Several problems of one file as one CaseError (the first, the others in `also`)."""
    unique = {str(one): one for problem in problems for one in problem.each()}  # a check per cell says it once
    first, *rest = unique.values()
    return CaseError(first.file, first.case, first.field, first.message, rest)


def located(file: str, case: str | None, field: str | None, message: str) -> str:
    """A message about a data file, led by where it is: `FILE: case 'NAME': field 'a.b': message`."""
    where = [f"{file}"]
    if case:
        where.append(f"case '{case}'")
    if field:  # a key of the file: escaped and cut, as every quote of a stranger's file (messages.excerpt)
        where.append(f"field '{excerpt(field, 2 * EXCERPT_CHARS)[1:-1]}'")
    return f"{': '.join(where)}: {message}"


def validation_problems(err: ValidationError) -> list[tuple[str, str]]:
    """(dotted field, message) for each of pydantic's errors, in its order."""
    return [(".".join(str(p) for p in e["loc"] if p not in ("function-after", "function-before")), e["msg"])
            for e in err.errors()]


def _schema_models() -> dict[str, type[BaseModel]]:
    """Every model of the data files' schemas, by class name (how pydantic names a union's model members)."""
    found: dict[str, type[BaseModel]] = {}
    todo: list[type[BaseModel]] = [Strict]
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo += cls.__subclasses__()
    return found


def wrap_validation_error(err: ValidationError, file: str, case: str | None) -> CaseError:
    """The first pydantic error as a CaseError, worded for a person (matrix/messages.py: the field as the file spells
    it, the valid names where one is unknown); the rest follow in the message so none is hidden."""
    problems = readable_problems(err, _schema_models())
    return every_problem([CaseError(file, case, field or None, message) for field, message in problems])


class Strict(BaseModel):
    # No infinite or NaN number: `timeout_s: .inf` would wait forever (and crash the run's timer), a NaN compares
    # false with everything.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# --- what a case file may set: data, never code or files ------------------------------------------------------
# A case's `env:` and `engine_args` reach the cell process as they are, so a case file (a data file, perhaps a
# stranger's) must not name a file, a folder, a library or a class there: any of those runs code in the cell (a
# logging config names a handler class, LD_LIBRARY_PATH picks the libraries, trust_remote_code runs the model's own
# Python, compilation_config's backend is a function to import). So a case sets only what is on these lists: vLLM's
# switches of kernels, backends' implementations and numeric modes, and engine arguments of sizes, dtypes and
# scheduling, each taking a word, a number or a flag. Models, tokenizers and how they load are the model registry's
# (`_models.yaml`, the user's own); the KV cache, backend, draft and execution are the matrix's axes. Names of
# several vLLM releases are listed; the installed vLLM's own names are checked too (Vocabulary). Adding a name: it
# must load nothing.
CASE_ENV_VARS = frozenset({
    # attention and the KV cache
    "VLLM_ATTENTION_BACKEND", "VLLM_FLASH_ATTN_VERSION", "VLLM_USE_TRTLLM_ATTENTION", "VLLM_KV_CACHE_LAYOUT",
    "VLLM_MLA_DISABLE", "VLLM_DISABLE_FLASHINFER_PREFILL", "VLLM_USE_CUDNN_PREFILL",
    "VLLM_USE_TRTLLM_RAGGED_DEEPSEEK_PREFILL", "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE",
    "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_ATTN_SPLIT_KV",
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB", "VLLM_ROCM_USE_AITER",
    "VLLM_ROCM_USE_AITER_MHA", "VLLM_ROCM_USE_AITER_MLA",
    # sampling
    "VLLM_USE_FLASHINFER_SAMPLER",
    # GEMM and MoE kernels
    "VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_E8M0", "VLLM_DEEP_GEMM_WARMUP",
    "VLLM_USE_FLASHINFER_MOE_FP8", "VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_FLASHINFER_MOE_BACKEND",
    "VLLM_USE_TRITON_AWQ", "VLLM_MARLIN_USE_ATOMIC_ADD", "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER",
    "VLLM_DISABLED_KERNELS", "VLLM_USE_FUSED_MOE_GROUPED_TOPK",
    # compilation (the caches' folders are the harness's)
    "VLLM_DISABLE_COMPILE_CACHE", "VLLM_USE_STANDALONE_COMPILE", "VLLM_USE_AOT_COMPILE",
    "VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE", "VLLM_ENABLE_INDUCTOR_COORDINATE_DESCENT_TUNING", "VLLM_ENABLE_CUDAGRAPH_GC",
    # numerics and the engine's runner
    "VLLM_BATCH_INVARIANT", "VLLM_FLOAT32_MATMUL_PRECISION", "VLLM_COMPUTE_NANS_IN_LOGITS", "VLLM_USE_V1",
    "VLLM_USE_V2_MODEL_RUNNER",
})
CASE_ENGINE_ARGS = frozenset({
    "dtype", "seed", "max_model_len", "quantization", "block_size", "gpu_memory_utilization", "kv_cache_memory_bytes",
    "num_gpu_blocks_override", "swap_space", "cpu_offload_gb", "calculate_kv_scales", "enable_prefix_caching",
    "prefix_caching_hash_algo", "enable_chunked_prefill", "max_num_batched_tokens", "max_num_seqs",
    "long_prefill_token_threshold", "disable_sliding_window", "disable_cascade_attn",
    "disable_hybrid_kv_cache_manager", "kv_sharing_fast_prefill", "enforce_eager", "cudagraph_capture_sizes",
    "max_cudagraph_capture_size", "max_seq_len_to_capture", "async_scheduling", "scheduling_policy",
    "max_logprobs", "logprobs_mode", "disable_log_stats", "mamba_cache_dtype", "mamba_ssm_cache_dtype",
    "mamba_block_size", "mamba_cache_mode", "enable_expert_parallel", "moe_backend", "linear_backend",
    "disable_custom_all_reduce", "optimization_level", "stream_interval",
})
# Nested configurations a case may set, only these keys, each a plain value or a list of them: which custom ops
# run native (`custom_ops: ["none"]`) and the compile and CUDA-graph modes (the rest names folders, passes, code).
CASE_NESTED_ENGINE_ARGS = {"compilation_config": frozenset({"custom_ops", "mode", "cudagraph_mode"})}
# A value is a word, a number or a flag: no path separator, space or quote, and no dotted name (`os.system`, a
# class to import).
_PLAIN_TEXT = re.compile(r"[A-Za-z0-9_.,:+-]{0,256}")
_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*\.[A-Za-z_]")


def plain_value(value: Any) -> bool:
    if isinstance(value, bool | int) or (isinstance(value, float) and math.isfinite(value)):
        return True
    return isinstance(value, str) and bool(_PLAIN_TEXT.fullmatch(value)) and not _DOTTED_NAME.search(value)


def case_env_problem(name: str, value: str) -> str | None:
    """Why a case's `env:` may not set `name` to `value` (None: it may)."""
    if name not in CASE_ENV_VARS:
        return ("not one of vLLM's switches a case may set (matrix/schema.py CASE_ENV_VARS): a variable that names "
                "a path, library, plugin, module or config loads code or files in the cell")
    if not plain_value(value):
        return f"{value!r} is not a plain value (a word, a number or a flag; no path, space or dotted name)"
    return None


def case_engine_arg_problem(name: str, value: Any) -> str | None:
    """Why a case's `engine_args` may not set `name` to `value` (None: it may): no model, tokenizer, remote code,
    path, plugin, nested configuration or anything else that loads code or files, and only plain values (a nested
    configuration only as far as CASE_NESTED_ENGINE_ARGS lists its keys)."""
    if name in CASE_NESTED_ENGINE_ARGS:
        allowed = CASE_NESTED_ENGINE_ARGS[name]
        if not isinstance(value, dict) or not set(value) <= allowed:
            return (f"{value!r}: a case may set only {sorted(allowed)} of {name} (its other keys name folders, "
                    "passes or code)")
        value = [item for v in value.values() for item in (v if isinstance(v, list) else [v])]
    elif name not in CASE_ENGINE_ARGS:
        return ("not an engine argument a case may set (matrix/schema.py CASE_ENGINE_ARGS): the model registry "
                "(_models.yaml) names models, tokenizers, remote code and how they load, the matrix's axes set the KV "
                "cache, backend, draft and execution, and nothing in a case loads code or files")
    if not all(plain_value(item) for item in (value if isinstance(value, list) else [value])):
        return (f"{value!r} is not a plain value: a case's engine arguments are words, finite numbers, flags or "
                "lists of them (no path, dotted name or nested configuration)")
    return None


# --- model registry and GPU pool --------------------------------------------------------------------------


# Speculative methods that propose without a draft model (no `model`, no draft KV cache of their own): their
# registry entry needs no checkpoint.
MODEL_FREE_DRAFT_METHODS = frozenset({"ngram", "ngram_gpu", "suffix"})


class DraftSpec(Strict):
    """A registry entry's use as a draft: vLLM's speculative method, its token count and any other field of
    `speculative_config` (`config`, e.g. `{prompt_lookup_max: 3}`; checked against the cell's release as it runs)."""

    method: str
    num_speculative_tokens: int = Field(default=3, ge=1)
    config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _fields_of_their_own(self) -> DraftSpec:
        owned = {"method", "model", "num_speculative_tokens"} & set(self.config)
        if owned:
            raise ValueError(f"config: {sorted(owned)} are set by the entry itself (method) or the harness (model)")
        return self


class ModelEntry(Strict):
    """A model the cases may name: a real hub id for users with hub access, a tiny local builder for offline runs."""

    description: str = ""
    hub_id: str | None = None
    tiny: str | None = None
    engine_args: dict[str, Any] = Field(default_factory=dict)
    hub_engine_args: dict[str, Any] = Field(default_factory=dict)
    draft: DraftSpec | None = None
    for_model: str | None = None

    @model_validator(mode="after")
    def _has_a_source(self) -> ModelEntry:
        model_free = self.draft is not None and self.draft.method in MODEL_FREE_DRAFT_METHODS
        if not self.hub_id and not self.tiny and not model_free:
            raise ValueError("a model needs a hub_id, a tiny builder, or both")
        return self


# x86 CPU levels, lowest first: a class of a lower level can be emulated on a CPU of a higher one.
X86_CPU_LEVELS = ("avx2", "avx512", "amx")


class GpuClass(Strict):
    """One column of the matrix: what decides vLLM's behaviour on that class."""

    device: Literal["cpu", "cuda"]
    compute_capability: str | None = None
    # CPU classes: the architecture (platform.machine()) and the best level vLLM's CPU backend decides by there
    # (x86: amx with AMX tiles, avx512, else avx2; Arm: neon), which decides its kernels, backends and refusals.
    cpu_arch: str | None = None
    cpu_isa: Literal["amx", "avx512", "avx2", "neon"] | None = None
    memory_gb: list[float] = Field(default_factory=list)
    names: list[str] = Field(default_factory=list)
    engine_defaults: dict[str, Any] = Field(default_factory=dict)
    slots_per_device: int = Field(default=1, ge=1)
