"""The matrix's axes: their names, defaults and short names in cell ids, and the parts of a case's `matrix:`
block (the values of each axis, and the `extra:` / `exclude:` combinations)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from kvmatrix.matrix.schema import Strict

AXES = ("kv_cache_dtype", "kv_cache_dtype_skip_layers", "speculative", "draft_kv_cache_dtype",
        "draft_attention_backend", "attention_backend", "tensor_parallel_size", "pipeline_parallel_size", "execution",
        "workload")
AXIS_DEFAULTS: dict[str, Any] = {
    "kv_cache_dtype": "auto",
    "kv_cache_dtype_skip_layers": [],
    "speculative": None,
    "draft_kv_cache_dtype": None,  # the draft inherits the target's KV dtype
    "draft_attention_backend": None,  # vLLM picks the draft's backend
    "attention_backend": None,
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "execution": "default",
    "workload": "plain",
}
# How the engine executes the model (harness/vllm_compat/execution.py maps each to a release's engine arguments):
# `default` is the class's own default, DEFAULT_EXECUTION (vLLM's default on a GPU class, what users serve with;
# eager on a CPU class, whose matrix must stay within minutes on two cores).
EXECUTION_VALUES = ("default", "eager", "compiled", "graphs", "graphs_piecewise", "graphs_full")
DEFAULT_EXECUTION = {"cuda": "graphs", "cpu": "eager"}
# The runtime path a cell's generation takes (harness/cell/workloads.py).
WORKLOAD_VALUES = ("plain", "shared_prefix", "chunked_prefill", "preemption")
# The draft's own settings (speculative_config's fields, per release in harness/vllm_compat/speculative.py): a
# cell that sets one has a draft.
DRAFT_AXES = ("draft_kv_cache_dtype", "draft_attention_backend")
# The plainest run, every differential cell's oracle by default: eager, no prefix reuse, no chunking.
ORACLE = {"execution": "eager", "workload": "plain"}


@with_config(ConfigDict(extra="allow"))  # a newer harness's axes pass
class Axes(TypedDict, total=False):
    """A cell's place on its case's matrix, a value for each of AXES: `Cell.axes` and the record's `axes` (records
    from before the execution and workload axes lack those two)."""

    kv_cache_dtype: str
    kv_cache_dtype_skip_layers: list[str]
    speculative: str | None
    draft_kv_cache_dtype: str | None
    draft_attention_backend: str | None
    attention_backend: str | None
    tensor_parallel_size: int
    pipeline_parallel_size: int
    execution: str  # EXECUTION_VALUES (`default`: the class's default, DEFAULT_EXECUTION)
    workload: str  # WORKLOAD_VALUES


def cell_axes(values: dict[str, Any]) -> Axes:
    """A cell's axes: each of AXES from `values`, in that order (the order its record's JSON keeps)."""
    return Axes(kv_cache_dtype=values["kv_cache_dtype"],
                kv_cache_dtype_skip_layers=values["kv_cache_dtype_skip_layers"],
                speculative=values["speculative"], draft_kv_cache_dtype=values["draft_kv_cache_dtype"],
                draft_attention_backend=values["draft_attention_backend"],
                attention_backend=values["attention_backend"],
                tensor_parallel_size=values["tensor_parallel_size"],
                pipeline_parallel_size=values["pipeline_parallel_size"],
                execution=values["execution"], workload=values["workload"])


def resolved_execution(execution: str, device: str | None) -> str:
    """The execution a cell runs on a class of this device: `default` as the class's default."""
    return DEFAULT_EXECUTION.get(device or "cuda", "eager") if execution == "default" else execution
# Axes a cell id names only where its case varies them from the default, so the ids of cases without them stay
# as they were: `fp8-every-backend[kv=fp8,skip=-,spec=-,attn=FLASHINFER]`, `tp2-llama[kv=fp8,skip=-,spec=-,tp=2]`.
OPTIONAL_ID_AXES = ("draft_kv_cache_dtype", "draft_attention_backend", "attention_backend", "tensor_parallel_size",
                    "pipeline_parallel_size", "execution", "workload")
# Short names used in cell ids: `ct-llama[kv=bfloat16,skip=-,spec=-]`.
AXIS_ID_NAMES = {
    "kv_cache_dtype": "kv",
    "kv_cache_dtype_skip_layers": "skip",
    "speculative": "spec",
    "draft_kv_cache_dtype": "dkv",
    "draft_attention_backend": "dattn",
    "attention_backend": "attn",
    "tensor_parallel_size": "tp",
    "pipeline_parallel_size": "pp",
    "execution": "exec",
    "workload": "wl",
}


class Combination(Strict):
    """One `extra:` / `exclude:` entry: values for some axes."""

    kv_cache_dtype: str | None = None
    kv_cache_dtype_skip_layers: list[str] | None = None
    speculative: str | None = None
    draft_kv_cache_dtype: str | None = None
    draft_attention_backend: str | None = None
    attention_backend: str | None = None
    tensor_parallel_size: int | None = Field(default=None, ge=1)
    pipeline_parallel_size: int | None = Field(default=None, ge=1)
    execution: Literal[EXECUTION_VALUES] | None = None  # type: ignore[valid-type]
    workload: Literal[WORKLOAD_VALUES] | None = None  # type: ignore[valid-type]

    def given(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if k in self.model_fields_set}


class Exclusion(Strict):
    """One `exclude:` entry: the combinations it leaves out, each axis named as a `when:` names it: a value, or a
    list of values (any of them; a skip list's any-of is a list of skip lists)."""

    kv_cache_dtype: str | list[str] | None = None
    kv_cache_dtype_skip_layers: list[str] | list[list[str]] | None = None
    speculative: str | list[str | None] | None = None
    draft_kv_cache_dtype: str | list[str | None] | None = None
    draft_attention_backend: str | list[str | None] | None = None
    attention_backend: str | list[str | None] | None = None
    tensor_parallel_size: int | list[int] | None = None
    pipeline_parallel_size: int | list[int] | None = None
    execution: Literal[EXECUTION_VALUES] | list[Literal[EXECUTION_VALUES]] | None = None  # type: ignore[valid-type]
    workload: Literal[WORKLOAD_VALUES] | list[Literal[WORKLOAD_VALUES]] | None = None  # type: ignore[valid-type]

    def given(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if k in self.model_fields_set}


class MatrixAxes(Strict):
    kv_cache_dtype: list[str] = Field(default_factory=lambda: ["auto"], min_length=1)
    # Strings, as vLLM wants them (`--kv-cache-dtype-skip-layers 0 3 sliding_window`); ints are rejected there.
    kv_cache_dtype_skip_layers: list[list[str]] = Field(default=[[]], min_length=1)  # pydantic copies it
    speculative: list[str | None] = Field(default=[None], min_length=1)
    # The draft's own KV dtype and attention backend (null: inherited / vLLM's pick); a cell id names them as `dkv`
    # and `dattn` where the case varies them.
    draft_kv_cache_dtype: list[str | None] = Field(default=[None], min_length=1)
    draft_attention_backend: list[str | None] = Field(default=[None], min_length=1)
    attention_backend: list[str | None] = Field(default=[None], min_length=1)
    # GPUs per cell: a cell runs on tensor_parallel_size x pipeline_parallel_size GPUs of its class.
    tensor_parallel_size: list[int] = Field(default_factory=lambda: [1], min_length=1)
    pipeline_parallel_size: list[int] = Field(default_factory=lambda: [1], min_length=1)
    execution: list[Literal[EXECUTION_VALUES]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: ["default"], min_length=1)
    workload: list[Literal[WORKLOAD_VALUES]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: ["plain"], min_length=1)
    # Points added to the cross product (each one cell, the axes it leaves out at their defaults), as a CI
    # matrix's include; named `extra` because a case file's top-level `include:` pulls in shared blocks.
    extra: list[Combination] = Field(default_factory=list)
    exclude: list[Exclusion] = Field(default_factory=list)
