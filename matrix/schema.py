"""The one typed schema of kvmatrix's data files: case files, the model registry and the GPU pool.

Validation is strict (unknown keys, wrong types, unknown dtype names are errors) and every error names the file,
the case and the field, so that a typo in a nightly case file is found before any engine starts.
pydantic does the type work; this module adds the vocabulary (axes, selectors, record fields).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from matrix.conditions import check_condition_value


@dataclass(frozen=True)
class Vocabulary:
    """What the installed vLLM accepts, for checks no schema can make alone; an empty set is not checked
    (no vLLM installed)."""

    kv_cache_dtypes: frozenset[str] = frozenset()
    engine_args: frozenset[str] = frozenset()
    env_vars: frozenset[str] = frozenset()


class CaseError(ValueError):
    """A data file that cannot be used, with where the problem is."""

    def __init__(self, file: str, case: str | None, field: str | None, message: str):
        self.file, self.case, self.field, self.message = file, case, field, message
        where = [f"{file}"]
        if case:
            where.append(f"case '{case}'")
        if field:
            where.append(f"field '{field}'")
        super().__init__(f"{': '.join(where)}: {message}")


def validation_problems(err: ValidationError) -> list[tuple[str, str]]:
    """(dotted field, message) for each of pydantic's errors, in its order."""
    return [(".".join(str(p) for p in e["loc"] if p not in ("function-after", "function-before")), e["msg"])
            for e in err.errors()]


def wrap_validation_error(err: ValidationError, file: str, case: str | None) -> CaseError:
    """The first pydantic error as a CaseError; the rest follow in the message so none is hidden."""
    problems = validation_problems(err)
    field, message = problems[0]
    if len(problems) > 1:
        message += "; also: " + "; ".join(f"field '{f}': {m}" for f, m in problems[1:])
    return CaseError(file, case, field or None, message)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --- axes -----------------------------------------------------------------------------------------------

AXES = ("kv_cache_dtype", "kv_cache_dtype_skip_layers", "speculative", "attention_backend")
AXIS_DEFAULTS: dict[str, Any] = {
    "kv_cache_dtype": "auto",
    "kv_cache_dtype_skip_layers": [],
    "speculative": None,
    "attention_backend": None,
}
# Short names used in cell ids: `ct-llama[kv=bfloat16,skip=-,spec=-]`.
AXIS_ID_NAMES = {
    "kv_cache_dtype": "kv",
    "kv_cache_dtype_skip_layers": "skip",
    "speculative": "spec",
    "attention_backend": "attn",
}


class Combination(Strict):
    """One `include:` / `exclude:` entry: values for some axes."""

    kv_cache_dtype: str | None = None
    kv_cache_dtype_skip_layers: list[str] | None = None
    speculative: str | None = None
    attention_backend: str | None = None

    def given(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if k in self.model_fields_set}


class MatrixAxes(Strict):
    kv_cache_dtype: list[str] = Field(default_factory=lambda: ["auto"], min_length=1)
    # Strings, as vLLM wants them (`--kv-cache-dtype-skip-layers 0 3 sliding_window`); ints are rejected there.
    kv_cache_dtype_skip_layers: list[list[str]] = Field(default_factory=lambda: [[]], min_length=1)
    speculative: list[str | None] = Field(default_factory=lambda: [None], min_length=1)
    attention_backend: list[str | None] = Field(default_factory=lambda: [None], min_length=1)
    include: list[Combination] = Field(default_factory=list)
    exclude: list[Combination] = Field(default_factory=list)


# --- expectations ---------------------------------------------------------------------------------------

# What a layer / KV group / attention builder record holds that an expectation may name.
LAYER_FIELDS = {"kv_cache_dtype", "backend", "spec_dtype", "page_size_bytes", "group", "role"}
GROUP_FIELDS = {"dtype", "block_size", "page_size_bytes", "kv_quant_mode", "cache_dtype_str", "spec_type"}
SELECTOR_WORDS = {"all", "target", "draft", "skipped", "not_skipped"}
WHEN_KEYS = set(AXES) | {"model", "gpu", "vllm_version", "emulated"}


def _check_selector(value: Any) -> Any:
    if isinstance(value, str):
        if value not in SELECTOR_WORDS:
            raise ValueError(f"unknown selector {value!r}; use one of {sorted(SELECTOR_WORDS)} or layer indices")
    elif isinstance(value, list):
        if not value or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            raise ValueError("a selector list holds layer indices (ints)")
    else:
        raise ValueError("a selector is a word or a list of layer indices")
    return value


def _check_when(value: dict[str, Any]) -> dict[str, Any]:
    for key, cond in value.items():
        if key not in WHEN_KEYS:
            raise ValueError(f"unknown key {key!r} in when; use {sorted(WHEN_KEYS)}")
        if key == "gpu" and isinstance(cond, dict):
            for sub in cond.values():
                if problem := check_condition_value(sub):
                    raise ValueError(f"gpu: {problem}")
        elif problem := check_condition_value(cond):
            raise ValueError(f"{key}: {problem}")
    return value


class CrashExpected(Strict):
    """An expected failure: the cell must fail with this signature (xfail); a link says where it is tracked."""

    signature: str
    link: str | None = None
    reason: str | None = None


class RefusalExpected(Strict):
    """vLLM must refuse this configuration with one of these signatures (a correct, clear rejection: the cell
    passes). With `optional`, running is fine too (the other checks then decide): "run it right or refuse it
    clearly", never crash any other way."""

    signature: str | list[str]
    optional: bool = False
    reason: str | None = None

    def allows(self, signature: str | None) -> bool:
        return signature in ([self.signature] if isinstance(self.signature, str) else self.signature)


class RecordCheck(Strict):
    """Every selected layer (or its KV group / attention builder) must show these values."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)
    select: str | list[int] = "all"

    @field_validator("select")
    @classmethod
    def check_select(cls, value: Any) -> Any:
        return _check_selector(value)

    def wanted(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class PageSizeRatio(Strict):
    of: str | list[int]
    to: str | list[int]
    equals: float

    @field_validator("of", "to")
    @classmethod
    def check_selectors(cls, value: Any) -> Any:
        return _check_selector(value)


class Expectation(Strict):
    when: dict[str, Any] = Field(default_factory=dict)
    crash: Literal[False] | CrashExpected | None = None
    refuse: RefusalExpected | None = None
    layers: RecordCheck | None = None
    groups: RecordCheck | None = None
    builders: RecordCheck | None = None
    page_size_ratio: PageSizeRatio | None = None

    @field_validator("when")
    @classmethod
    def check_when(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_when(value)

    @model_validator(mode="after")
    def _one_check_at_least(self) -> Expectation:
        checks = ("crash", "refuse", "layers", "groups", "builders", "page_size_ratio")
        if all(getattr(self, c) is None for c in checks):
            raise ValueError(f"an expectation needs at least one of {list(checks)}")
        for name, fields in (("layers", LAYER_FIELDS), ("groups", GROUP_FIELDS)):
            check = getattr(self, name)
            if check is not None:
                unknown = set(check.wanted()) - fields
                if unknown:
                    raise ValueError(f"{name}: unknown field(s) {sorted(unknown)}; known: {sorted(fields)}")
        if self.crash is not None and self.refuse is not None:
            raise ValueError("an expectation is a known crash or an expected refusal, not both")
        return self


class SkipRule(Strict):
    when: dict[str, Any] = Field(default_factory=dict)
    reason: str

    @field_validator("when")
    @classmethod
    def check_when(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_when(value)


class Generation(Strict):
    prompts: list[str] = Field(default_factory=lambda: ["The capital of France is", "1 2 3 4 5"], min_length=1)
    max_tokens: int = Field(default=8, ge=1)


class ExpectedDrop(Strict):
    """A configuration known to cost accuracy (a deliberately harmful one, or a tracked bug): a significant drop
    there is `xfail`; no drop fails (the loss is gone: update the case)."""

    when: dict[str, Any] = Field(default_factory=dict)
    reason: str
    link: str | None = None

    @field_validator("when")
    @classmethod
    def check_when(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_when(value)


class PinnedScore(Strict):
    """The baseline's score must be within `rtol` of `value` (how vLLM's own lm-eval configs pin a metric)."""

    value: float
    rtol: float = Field(default=0.08, ge=0)


class Accuracy(Strict):
    """lm-eval accuracy of every cell, compared paired (same samples) with the case's baseline cell: the same
    axes with `baseline_kv_cache_dtype`, no skipped layers, no speculation, no forced backend."""

    task: str
    metric: str = "exact_match,none"  # lm-eval's results key: `<metric>,<filter>`
    limit: int | None = Field(default=None, ge=1)
    num_fewshot: int | None = Field(default=None, ge=0)
    # A cell fails when its drop is significant (the interval excludes zero) and larger than `max_drop`.
    max_drop: float = Field(default=0.0, ge=0, le=1)
    confidence: float = Field(default=0.95, gt=0, lt=1)
    # `auto` is the model dtype for plain checkpoints; an FP8-KV checkpoint's `auto` is fp8, so it sets bfloat16.
    baseline_kv_cache_dtype: str = "auto"
    pinned: PinnedScore | None = None
    expected_drops: list[ExpectedDrop] = Field(default_factory=list)


class Case(Strict):
    name: str
    description: str = ""
    # Free labels for grouping cells in reports, e.g. the regression class a case covers (`class-7`).
    tags: list[str] = Field(default_factory=list)
    model: str
    gpus: list[str | dict[str, Any]] = Field(default_factory=lambda: ["*"])
    matrix: MatrixAxes = Field(default_factory=MatrixAxes)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    # Environment for the cell process: only variables the installed vLLM reads (checked at load), never
    # PATH, LD_PRELOAD or the harness's own.
    env: dict[str, str] = Field(default_factory=dict)
    generate: Generation = Field(default_factory=Generation)
    timeout_s: float = Field(default=600, gt=0)
    retries: int = Field(default=0, ge=0)
    skip: list[SkipRule] = Field(default_factory=list)
    expect: list[Expectation] = Field(default_factory=list)
    accuracy: Accuracy | None = None

    @field_validator("gpus")
    @classmethod
    def _check_gpus(cls, value: list) -> list:
        for cond in value:
            if isinstance(cond, dict):
                for sub in cond.values():
                    if problem := check_condition_value(sub):
                        raise ValueError(problem)
        return value


# --- model registry and GPU pool --------------------------------------------------------------------------


class DraftSpec(Strict):
    method: str
    num_speculative_tokens: int = Field(default=3, ge=1)


class ModelEntry(Strict):
    """A model the cases may name: a real hub id for users with hub access, a tiny local builder for offline runs."""

    description: str = ""
    hub_id: str | None = None
    tiny: str | None = None
    num_layers: int | None = Field(default=None, ge=1)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    hub_engine_args: dict[str, Any] = Field(default_factory=dict)
    draft: DraftSpec | None = None
    for_model: str | None = None

    @model_validator(mode="after")
    def _has_a_source(self) -> ModelEntry:
        if not self.hub_id and not self.tiny:
            raise ValueError("a model needs a hub_id, a tiny builder, or both")
        return self


# x86 CPU levels, lowest first: a class of a lower level can be emulated on a CPU of a higher one.
X86_CPU_LEVELS = ("avx2", "avx512")


class GpuClass(Strict):
    """One column of the matrix: what decides vLLM's behaviour on that class."""

    device: Literal["cpu", "cuda"]
    compute_capability: str | None = None
    # CPU classes: the architecture (platform.machine()) and the best vector level vLLM's CPU backend finds there
    # (x86: avx512 with AVX-512 or AMX, else avx2; Arm: neon), which decides its kernels and refusals.
    cpu_arch: str | None = None
    cpu_isa: Literal["avx512", "avx2", "neon"] | None = None
    memory_gb: list[float] = Field(default_factory=list)
    names: list[str] = Field(default_factory=list)
    engine_defaults: dict[str, Any] = Field(default_factory=dict)
    slots_per_device: int = Field(default=1, ge=1)
