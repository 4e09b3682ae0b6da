"""What a case expects of its cells' records, and when a cell is skipped: the `when:` clauses and layer
selectors every rule uses, the `expect:` rules (a crash or refusal, checks of layers, KV groups and attention
builders, page-size ratios), the `skip:` rules and the `accuracy:` block (baseline comparison, pinned score,
expected drops). Record fields named here are the ones harness/record/types.py gives layers and KV groups.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from kvmatrix.matrix.axes import AXES, EXECUTION_VALUES, ORACLE, WORKLOAD_VALUES
from kvmatrix.matrix.conditions import check_condition_value
from kvmatrix.matrix.messages import did_you_mean, one_of
from kvmatrix.matrix.schema import Strict

# What a layer / KV group / attention builder record holds that an expectation may name.
LAYER_FIELDS = {"kv_cache_dtype", "backend", "spec_dtype", "page_size_bytes", "group", "role", "k_scale", "v_scale"}
GROUP_FIELDS = {"dtype", "block_size", "page_size_bytes", "kv_quant_mode", "cache_dtype_str", "spec_type"}
# Fields a record holds as names (dtypes, backends): a number there could never match (`spec_dtype: 16`).
NAME_FIELDS = {"kv_cache_dtype", "backend", "spec_dtype", "role", "dtype", "kv_quant_mode", "cache_dtype_str",
               "spec_type"}
SELECTOR_WORDS = {"all", "target", "draft", "skipped", "not_skipped"}
WHEN_KEYS = set(AXES) | {"model", "gpu", "vllm_version", "emulated"}


def _check_selector(value: Any) -> Any:
    if isinstance(value, str):
        if value not in SELECTOR_WORDS:
            raise ValueError(f"unknown selector {value!r}{did_you_mean(value, SELECTOR_WORDS)}; use one of "
                             f"{sorted(SELECTOR_WORDS)} or layer indices")
    elif isinstance(value, list):
        if not value or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            raise ValueError("a selector list holds layer indices (ints)")
    else:
        raise ValueError("a selector is a word or a list of layer indices")
    return value


def _check_when(value: dict[str, Any]) -> dict[str, Any]:
    for key, cond in value.items():
        if key not in WHEN_KEYS:
            raise ValueError(f"unknown key {key!r} in when{did_you_mean(key, WHEN_KEYS)}; valid: {one_of(WHEN_KEYS)}")
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

    @property
    def names(self) -> list[str]:
        return [self.signature]


class RefusalExpected(Strict):
    """vLLM must refuse this configuration with one of these signatures (a correct, clear rejection: the cell
    passes). With `optional`, running is fine too (the other checks then decide): "run it right or refuse it
    clearly", never crash any other way."""

    signature: str | list[str]
    optional: bool = False
    reason: str | None = None

    @property
    def names(self) -> list[str]:
        """The signatures (or families of them, harness/vllm_compat/signatures.py) any of which is the refusal."""
        return [self.signature] if isinstance(self.signature, str) else self.signature


class RecordCheck(Strict):
    """Every selected layer (or its KV group / attention builder) must show these values."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)
    select: str | list[int] = "all"

    @field_validator("select")
    @classmethod
    def check_select(cls, value: Any) -> Any:
        return _check_selector(value)

    @model_validator(mode="after")
    def _names_are_names(self) -> RecordCheck:
        for field, value in self.wanted().items():
            values = value if isinstance(value, list) else [value]
            if field in NAME_FIELDS and any(not isinstance(v, str) for v in values):
                raise ValueError(f"{field} is a name as records spell it (e.g. bfloat16, float8_e4m3fn), not "
                                 f"{value!r}: no record could match")
        return self

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
    # The differential rule's token comparison with the cell's oracle (Differential below): `exact` (the same
    # greedy tokens: where numerics cannot differ, e.g. a bf16 prefix-cache hit in eager mode) or `close`.
    tokens: Literal["exact", "close"] | None = None

    @field_validator("when")
    @classmethod
    def check_when(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_when(value)

    @model_validator(mode="after")
    def _one_check_at_least(self) -> Expectation:
        checks = ("crash", "refuse", "layers", "groups", "builders", "page_size_ratio", "tokens")
        if all(getattr(self, c) is None for c in checks):
            raise ValueError(f"an expectation needs at least one of {list(checks)}")
        for name, fields in (("layers", LAYER_FIELDS), ("groups", GROUP_FIELDS)):
            check = getattr(self, name)
            if check is not None:
                _check_record_fields(name, check.wanted(), fields)
        if self.crash is not None and self.refuse is not None:
            raise ValueError("an expectation is a known crash or an expected refusal, not both")
        return self


def _check_record_fields(name: str, wanted: dict[str, Any], fields: set[str]) -> None:
    """A layers / groups check names fields the record holds, and a name field (a dtype, a backend) by name."""
    unknown = sorted(set(wanted) - fields)
    if unknown:
        raise ValueError(f"{name}: unknown field(s) {unknown}{did_you_mean(unknown[0], fields)}; known: "
                         f"{sorted(fields)}")


class SkipRule(Strict):
    when: dict[str, Any] = Field(default_factory=dict)
    reason: str

    @field_validator("when")
    @classmethod
    def check_when(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_when(value)


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


class OracleAxes(Strict):
    """The oracle a differential cell is compared with: its own axes, with this execution and workload."""

    execution: Literal[EXECUTION_VALUES] = ORACLE["execution"]  # type: ignore[valid-type]
    workload: Literal[WORKLOAD_VALUES] = ORACLE["workload"]  # type: ignore[valid-type]


class Differential(Strict):
    """Every cell whose execution or workload (as it runs on a class) differs from its oracle's is compared with
    the oracle cell, judged once both records exist (harness/judge/differential.py): the resolved state is
    identical, a crash in one of them only fails naming the mode that crashed, and the greedy tokens agree:
    exactly where an `expect:` rule says `tokens: exact`, else closely. Close: equal up to the first divergent
    token, each chosen token's logprob within `logprob_tolerance` of the oracle's, and the divergent tokens a near
    tie (within `tie_tolerance` of each other in the oracle's or the cell's top `top_logprobs`). Where the cell
    decoded its oracle's tokens teacher-forced, that comparison decides instead of "closely"
    (harness/judge/teacher_forced.py: its distance against the oracle's noise floor; a top-1 flip is a preference
    beyond `tie_tolerance`); where the case gives answers, they are paired too; accuracy cells also compare their
    samples, paired, as with the accuracy baseline. `differential: false` turns it off."""

    oracle: OracleAxes = Field(default_factory=OracleAxes)
    top_logprobs: int = Field(default=5, ge=1, le=20)
    logprob_tolerance: float = Field(default=0.1, gt=0)
    tie_tolerance: float = Field(default=0.1, ge=0)
