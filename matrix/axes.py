"""The matrix's axes, each declared once in AXIS_TABLE, and everything a case file, a cell and a report know of them
made from it: the `matrix:` block of a case file (MatrixAxes: a list of values per axis, `extra:` points, `exclude:`
rules), a cell's axes (Axes, also its record's `axes`), the names and defaults the expansion, the cell ids
(matrix/expand.py), the engine arguments (harness/run/task/spec.py ENGINE_ROUTES), the HTML grid
(reports/html_grid.py) and the repro scripts (from the engine arguments) read. A new axis is one entry of the table
(and a route in spec.py where none of the existing ones passes it to vLLM as it must)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import ConfigDict, Field, create_model, with_config
from typing_extensions import TypedDict

from kvmatrix.matrix.schema import Strict

# How the engine executes the model (harness/vllm_compat/execution.py maps each to a release's engine arguments):
# `default` is the class's own default, DEFAULT_EXECUTION (vLLM's default on a GPU class, what users serve with;
# eager on a CPU class, whose matrix must stay within minutes on two cores).
EXECUTION_VALUES = ("default", "eager", "compiled", "graphs", "graphs_piecewise", "graphs_full")
DEFAULT_EXECUTION = {"cuda": "graphs", "cpu": "eager"}
# The runtime path a cell's generation takes (harness/cell/workloads.py).
WORKLOAD_VALUES = ("plain", "shared_prefix", "chunked_prefill", "preemption")

# How an axis reaches vLLM (harness/run/task/spec.py ENGINE_ROUTES does each): `argument`, the engine argument
# `engine_field` (else the axis's name), always given; `argument_if_set`, the same where the value is not the
# default (vLLM's own default holds); `attention_config`, that field of `attention_config`, where set; `draft`,
# `speculative_config` from the registry's draft entry; `draft_field`, that field of the draft's
# `speculative_config` (a cell that sets one has a draft); `execution` and `workload`, the engine arguments of that
# mode (harness/vllm_compat/execution.py, spec.py workload_plan).
EngineRoute = Literal["argument", "argument_if_set", "attention_config", "draft", "draft_field", "execution",
                      "workload"]


@dataclass(frozen=True)
class Axis:
    """One axis of the matrix. `name`: the key under a case's `matrix:`, in a cell's axes and in `when:` clauses;
    `id_key`: its name in cell ids (`kv=fp8`) and the grid's headers; `default`: the value of an axis a case or an
    `extra:` point leaves unset; `value`: the type of one value (in records); `choices` / `minimum`: what a case
    file may give besides; `in_every_id`: named in every cell id (else only in the ids of a case whose cells
    differ from the default there, so the ids of cases without it stay as they were); `grid`: the HTML grid's rows
    (always shown) or columns (where a case's records differ); `ranks`: its value multiplies the GPUs one engine
    spans."""

    name: str
    id_key: str
    default: Any
    value: Any
    engine: EngineRoute
    engine_field: str = ""
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    in_every_id: bool = False
    grid: Literal["row", "column"] = "column"
    ranks: bool = False

    def case_type(self) -> Any:
        """The type of one value a case file may give."""
        if self.choices:
            return Literal[self.choices]
        return Annotated[self.value, Field(ge=self.minimum)] if self.minimum is not None else self.value

    def fresh_default(self) -> Any:
        """The default, a new copy each time (a list default is never shared)."""
        return copy.deepcopy(self.default)


AXIS_TABLE: tuple[Axis, ...] = (
    Axis("kv_cache_dtype", "kv", "auto", str, "argument", in_every_id=True, grid="row"),
    # Strings, as vLLM wants them (`--kv-cache-dtype-skip-layers 0 3 sliding_window`); ints are rejected there.
    Axis("kv_cache_dtype_skip_layers", "skip", [], list[str], "argument_if_set", in_every_id=True, grid="row"),
    Axis("speculative", "spec", None, str | None, "draft", in_every_id=True),  # a draft in the model registry
    # The draft's own KV dtype and attention backend (null: inherited from the target / vLLM's pick).
    Axis("draft_kv_cache_dtype", "dkv", None, str | None, "draft_field", "kv_cache_dtype"),
    Axis("draft_attention_backend", "dattn", None, str | None, "draft_field", "attention_backend"),
    Axis("attention_backend", "attn", None, str | None, "attention_config", "backend"),  # null: vLLM's pick
    # GPUs per cell: a cell runs on tensor_parallel_size x pipeline_parallel_size GPUs of its class.
    Axis("tensor_parallel_size", "tp", 1, int, "argument_if_set", minimum=1, ranks=True),
    Axis("pipeline_parallel_size", "pp", 1, int, "argument_if_set", minimum=1, ranks=True),
    Axis("execution", "exec", "default", str, "execution", choices=EXECUTION_VALUES),
    Axis("workload", "wl", "plain", str, "workload", choices=WORKLOAD_VALUES),
)
AXIS_BY_NAME = {axis.name: axis for axis in AXIS_TABLE}
AXES = tuple(AXIS_BY_NAME)  # the names, in the table's order (a cell id's, a record's JSON's)
AXIS_DEFAULTS: dict[str, Any] = {axis.name: axis.default for axis in AXIS_TABLE}
AXIS_ID_NAMES = {axis.name: axis.id_key for axis in AXIS_TABLE}
OPTIONAL_ID_AXES = tuple(axis.name for axis in AXIS_TABLE if not axis.in_every_id)
DRAFT_AXES = tuple(axis.name for axis in AXIS_TABLE if axis.engine == "draft_field")
RANK_AXES = tuple(axis.name for axis in AXIS_TABLE if axis.ranks)
# The plainest run, every differential cell's oracle by default: eager, no prefix reuse, no chunking. Its axes are
# the cell's mode; a cell and its oracle share every other axis.
ORACLE = {"execution": "eager", "workload": "plain"}


def value_text(value: Any) -> str:
    """An axis value as cell ids and the grid spell it: a list joined with `+`, none (or an empty list) as `-`."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return "-"
    return "+".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)


def varied(points: list[dict[str, Any]], axes: tuple[Axis, ...] = AXIS_TABLE) -> list[Axis]:
    """The axes (of `axes`, in order) whose value differs between `points`, an unset one read as its default."""
    return [axis for axis in axes if len({value_text(p.get(axis.name, axis.default)) for p in points}) > 1]


def resolved_execution(execution: str, device: str | None) -> str:
    """The execution a cell runs on a class of this device: `default` as the class's default."""
    return DEFAULT_EXECUTION.get(device or "cuda", "eager") if execution == "default" else execution


def cell_axes(values: dict[str, Any]) -> Axes:
    """A cell's axes: each of AXES from `values`, in the table's order (the order its record's JSON keeps)."""
    return {name: values[name] for name in AXES}


# Axes: a cell's place on its case's matrix, a value for each axis (`Cell.axes` and the record's `axes`; records
# from before the execution and workload axes lack those two; a newer harness's axes pass). mypy reads a TypedDict
# only from a literal, so it sees a plain mapping; pydantic checks records with the table's types.
if TYPE_CHECKING:
    Axes = dict[str, Any]
else:
    Axes = with_config(ConfigDict(extra="allow"))(
        TypedDict("Axes", {axis.name: axis.value for axis in AXIS_TABLE}, total=False))


class AxisFields(Strict):
    """A model with a field per axis (the models below are made from AXIS_TABLE)."""

    if TYPE_CHECKING:
        def __getattr__(self, axis: str) -> Any: ...


class ExcludeBase(AxisFields):
    def given(self) -> dict[str, Any]:
        """The axes the rule names (an unset one matches every value)."""
        return {k: v for k, v in self.model_dump().items() if k in self.model_fields_set}


def _model(name: str, base: type[AxisFields], doc: str, fields: dict[str, Any]) -> Any:
    return create_model(name, __base__=base, __module__=__name__, __doc__=doc, **fields)


if TYPE_CHECKING:
    ExtraPoint = AxisFields
    ExcludeRule = ExcludeBase
    MatrixAxes = AxisFields
else:
    ExtraPoint = _model(
        "ExtraPoint", AxisFields, "One `extra:` point: one cell, the axes it leaves unset at their defaults.",
        {a.name: (a.case_type(), Field(default_factory=a.fresh_default)) for a in AXIS_TABLE})
    # Each axis as a `when:` names it: a value, or a list of values, any of them (a skip list's any-of is a list of
    # skip lists).
    ExcludeRule = _model(
        "ExcludeRule", ExcludeBase, "One `exclude:` rule: values for some axes (an unset one matches every value).",
        {a.name: (a.case_type() | list[a.case_type()] | None, None) for a in AXIS_TABLE})
    MatrixAxes = _model(
        "MatrixAxes", AxisFields, "A case's `matrix:` block: the values of each axis (unset: its default alone).",
        {**{a.name: (list[a.case_type()], Field(default_factory=lambda a=a: [a.fresh_default()], min_length=1))
            for a in AXIS_TABLE},
         # Points added to the cross product (each one cell), as a CI matrix's include; named `extra` because a case
         # file's top-level `include:` pulls in shared blocks.
         "extra": (list[ExtraPoint], Field(default_factory=list)),
         "exclude": (list[ExcludeRule], Field(default_factory=list))})
