"""Expanding cases into cells: the cross product of a case's axes, minus `exclude:`, plus `extra:` (a CI
matrix's include), each cell with a stable, readable id and the GPU classes of the pool it applies to."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kvmatrix.matrix.axes import (
    AXES,
    AXIS_DEFAULTS,
    AXIS_TABLE,
    DRAFT_AXES,
    OPTIONAL_ID_AXES,
    ORACLE,
    RANK_AXES,
    Axes,
    cell_axes,
    resolved_execution,
    value_text,
)
from kvmatrix.matrix.case import Case
from kvmatrix.matrix.conditions import gpu_matches, matches, when_matches
from kvmatrix.matrix.messages import did_you_mean, one_of
from kvmatrix.matrix.schema import CaseError, GpuClass, ModelEntry, every_problem


@dataclass(frozen=True)
class Cell:
    cell_id: str
    case: Case
    axes: Axes
    gpu_classes: tuple[str, ...]
    source: str = field(default="", compare=False)
    baseline_id: str | None = None  # the cell whose accuracy this one is compared with (accuracy cases only)
    # The differential rule (matrix/expectations.py Differential), per GPU class: the cell this one is compared with
    # there, and the workloads whose prompts this cell generates plainly there as the oracle of such cells.
    oracles: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    references: tuple[tuple[str, tuple[str, ...]], ...] = field(default=(), compare=False)
    # Speculative decoding's two oracles (harness/judge/speculative.py): a draft cell's no-draft twin (the same
    # axes without the draft: greedy outputs must agree), and per GPU class its plain twin (the same draft, auto
    # KV, no draft options, no forced backend, eager and plain there: the acceptance it must not collapse from).
    # `twin_of_draft`: this cell is some draft cell's no-draft twin (it records logprobs for the comparison).
    draft_twin: str | None = field(default=None, compare=False)
    plain_twins: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    twin_of_draft: bool = field(default=False, compare=False)
    # Per GPU class, the case's model reference there (reference_axes: an unquantized cache, eager, plain), which
    # every other plain cell of the case is compared with (harness/judge/reference.py).
    model_references: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    reference_for: tuple[str, ...] = field(default=(), compare=False)  # the classes where it is the reference
    # A configuration kvmatrix adds as the model reference (or its eager oracle), which the case's matrix does not
    # list: the case's rules were written for its own cells (an fp8-only case's `layers: {kv_cache_dtype: fp8}`),
    # so such a cell is held only to starting and generating (harness/judge/judge.py `rules_of`).
    added_reference: bool = field(default=False, compare=False)

    @property
    def model(self) -> str:
        return self.case.model

    @property
    def gpus_needed(self) -> int:
        """GPUs of its class one engine of this cell spans (tensor x pipeline parallel ranks)."""
        return math.prod(self.axes[axis] for axis in RANK_AXES)

    def oracle_on(self, gpu_name: str) -> str | None:
        """The oracle this cell is compared with on that class (None: it is compared with none there)."""
        return dict(self.oracles).get(gpu_name)

    def references_on(self, gpu_name: str) -> tuple[str, ...]:
        """The workloads whose prompts this cell generates plainly on that class, as their cells' oracle."""
        return dict(self.references).get(gpu_name, ())

    def is_oracle_on(self, gpu_name: str) -> bool:
        return gpu_name in dict(self.references)

    def plain_twin_on(self, gpu_name: str) -> str | None:
        """The draft cell whose acceptance this one's is compared with on that class (None: none there)."""
        return dict(self.plain_twins).get(gpu_name)

    def reference_on(self, gpu_name: str) -> str | None:
        """The model reference this cell is compared with on that class (None: none there, or it is the one)."""
        return dict(self.model_references).get(gpu_name)

    def is_reference_on(self, gpu_name: str) -> bool:
        return gpu_name in self.reference_for

    def compared_with(self, gpu_name: str) -> set[str]:
        """Every cell this one is compared with on that class, which must run before it: its differential oracle,
        its model reference and its speculative twins (the accuracy baseline apart)."""
        return {c for c in (self.oracle_on(gpu_name), self.reference_on(gpu_name), self.draft_twin,
                            self.plain_twin_on(gpu_name)) if c}

    def context(self, gpu_name: str, gpu: GpuClass, vllm_version: str | None, emulated: bool) -> dict:
        """What `when:` clauses see for this cell on one GPU class (its execution as it runs on that class)."""
        return {
            **self.axes,
            "execution": resolved_execution(self.axes["execution"], gpu.device),
            "model": self.case.model,
            "gpu": {"name": gpu_name, **gpu.model_dump()},
            "vllm_version": vllm_version,
            "emulated": emulated,
        }

    def skip_reason(self, context: dict) -> str | None:
        for rule in self.case.skip:
            if when_matches(rule.when, context):
                return rule.reason
        return None


def case_values(case: Case, axis: str) -> list[Any]:
    """Every value the case gives an axis: its matrix's, then each `extra:` point's (an unset one its default)."""
    return list(getattr(case.matrix, axis)) + [getattr(point, axis) for point in case.matrix.extra]


def added_cells(cells: list[Cell]) -> dict[str, str]:
    """The cells of `cells` that their case's matrix does not list, by id, each with why kvmatrix adds it."""
    listed = {case.name: {_key(c) for c in combinations(case)} for case in {cell.case.name: cell.case
                                                                           for cell in cells}.values()}
    oracles = {oracle for cell in cells for _, oracle in cell.oracles}
    baselines = {cell.baseline_id for cell in cells}
    added = {}
    for cell in cells:
        if _key(dict(cell.axes)) in listed[cell.case.name]:
            continue
        added[cell.cell_id] = (
            "no-draft twin: a draft cell's greedy outputs are compared with it" if cell.twin_of_draft
            else "eager oracle: compiled or workload cells are compared with it" if cell.cell_id in oracles
            else "accuracy baseline: the case's cells are compared with it" if cell.cell_id in baselines
            else "run beside the case's cells")
    return added


def model_problem(source: str, case: str, model: str, models: dict[str, ModelEntry]) -> CaseError:
    """A case's `model:` that the registry does not hold."""
    return CaseError(source, case, "model", f"{model!r} is not in the model registry{did_you_mean(model, models)}; "
                     f"the registry: {one_of(models)} (`kvmatrix models` describes each)")


def _draft_problems(case: Case, models: dict[str, ModelEntry], source: str) -> list[CaseError]:
    problems = []
    for i, draft in enumerate(case_values(case, "speculative")):
        if draft is not None and (draft not in models or models[draft].draft is None):
            field_name = "matrix.speculative" if i < len(case.matrix.speculative) else "matrix.extra"
            drafts = [name for name, entry in models.items() if entry.draft is not None]
            what = ("a model of the registry, but not a draft (its entry has no `draft:`)" if draft in models
                    else f"not a draft model in the registry{did_you_mean(draft, drafts)}")
            problems.append(CaseError(source, case.name, field_name, f"{draft!r} is {what}; drafts: {one_of(drafts)}"))
    for i, point in enumerate(case.matrix.extra):
        if not point.speculative and any(getattr(point, a) for a in DRAFT_AXES):
            problems.append(CaseError(source, case.name, f"matrix.extra.{i}", "sets a draft option without a draft "
                                      "(speculative)"))
    return problems


def baseline_axes(case: Case) -> dict[str, Any] | None:
    """The axes of the cell that every accuracy cell of the case is compared with: the model as it ships."""
    if case.accuracy is None:
        return None
    return {**AXIS_DEFAULTS, "kv_cache_dtype": case.accuracy.baseline_kv_cache_dtype}


# The model reference's cache: unquantized whatever the checkpoint declares (an fp8 checkpoint's `auto` is fp8).
REFERENCE_KV_CACHE_DTYPE = "bfloat16"


def reference_axes(case: Case, combos: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The axes of the case's model reference: the model as it ships (no skip, no draft, no forced backend, plain)
    with an unquantized cache, `bfloat16`, or `auto` where the case has that cell and not the other (the judge
    checks that it resolved unquantized). None where the case compares nothing (`differential: false`) or is an
    accuracy case (its bf16 baseline is its comparison outside the configuration)."""
    if case.differential is False or case.accuracy is not None:
        return None
    plain = {**AXIS_DEFAULTS, "kv_cache_dtype": REFERENCE_KV_CACHE_DTYPE}
    keys = {_key(c) for c in combos}
    if _key(plain) not in keys and _key({**plain, "kv_cache_dtype": "auto"}) in keys:
        return {**plain, "kv_cache_dtype": "auto"}
    return plain


def cell_id(case: Case, axes: dict[str, Any], shown_optional: frozenset[str] = frozenset()) -> str:
    """`case[kv=fp8,skip=-,spec=-]`: every axis named in every id, then those of `shown_optional`, in the table's
    order."""
    shown = [a for a in AXIS_TABLE if a.in_every_id or a.name in shown_optional]
    return f"{case.name}[" + ",".join(f"{a.id_key}={value_text(axes[a.name])}" for a in shown) + "]"


# Cells a run expands to at most (`--max-cells` sets another cap, 0 none): a 10^6-cell matrix took 114 s and
# 2.3 GB to plan, then started a cell a second, skips included.
MAX_CELLS = 20_000


def matrix_size(case: Case) -> int:
    """The cells a case's matrix can expand to, counted without expanding it: its cross product and extra points
    (excludes only remove cells; the oracles a differential rule adds at most double them)."""
    m = case.matrix
    return math.prod(len(getattr(m, a)) for a in AXES) + len(m.extra)


def check_size(case: Case, source: str, max_cells: int | None) -> None:
    """CaseError where the case's matrix may expand to more than `max_cells` cells (None: no cap)."""
    if max_cells is not None and (size := matrix_size(case)) > max_cells:
        raise CaseError(source, case.name, "matrix", f"expands to up to {size:,} cells, over the {max_cells:,} "
                                                     "this run may still take (`--max-cells N` sets the cap, 0 none)")


def _key(combo: dict[str, Any], axes: tuple[str, ...] = AXES) -> tuple:
    """A combination as a dict key (a skip list is a list)."""
    return tuple(tuple(combo[a]) if isinstance(combo[a], list) else combo[a] for a in axes)


def cross_product(case: Case) -> list[dict[str, Any]]:
    """Every combination of the values the case's matrix gives each axis (before `exclude:` and `extra:`)."""
    return [dict(zip(AXES, values, strict=True))
            for values in itertools.product(*(getattr(case.matrix, a) for a in AXES))]


def combinations(case: Case) -> list[dict[str, Any]]:
    m = case.matrix
    kept = [
        combo for combo in cross_product(case)
        if not any(all(matches(v, combo[k]) for k, v in ex.given().items()) for ex in m.exclude)
        and (combo["speculative"] or not any(combo[a] for a in DRAFT_AXES))  # draft options need a draft
    ]
    seen = {_key(combo) for combo in kept}
    for point in m.extra:
        combo = point.model_dump()
        if _key(combo) not in seen:
            seen.add(_key(combo))
            kept.append(combo)
    return kept


def classes_for(case: Case, pool: dict[str, GpuClass]) -> tuple[str, ...]:
    return tuple(
        name for name, gpu in pool.items()
        if any(gpu_matches(cond, {"name": name, **gpu.model_dump()}) for cond in case.gpus)
    )


def expand_case(
    case: Case, models: dict[str, ModelEntry], pool: dict[str, GpuClass], source: str = "",
    max_cells: int | None = MAX_CELLS,
) -> list[Cell]:
    source = source or f"cases/{case.name}.yaml"
    check_size(case, source, max_cells)
    gpu_classes = classes_for(case, pool)
    problems = [*([model_problem(source, case.name, case.model, models)] if case.model not in models else []),
                *_draft_problems(case, models, source),
                *([CaseError(source, case.name, "gpus", f"matches no GPU class of the pool ({sorted(pool)})")]
                  if not gpu_classes else [])]
    if problems:
        raise every_problem(problems)
    combos = combinations(case)
    baseline = baseline_axes(case)
    if baseline is not None and baseline not in combos:
        combos.insert(0, baseline)  # a compared cell needs its baseline in the same run
    combos += draft_twins_missing(combos)  # a draft cell's greedy outputs are compared with its twin's
    reference = reference_axes(case, combos)
    added_reference = reference if reference is not None and reference not in combos else None
    if added_reference is not None:
        combos.append(added_reference)  # every plain cell of the case is compared with it
    shown = frozenset(a for a in OPTIONAL_ID_AXES if any(c[a] != AXIS_DEFAULTS[a] for c in combos))
    added, oracles, references = differential_plan(case, combos, gpu_classes, pool)
    ids = [cell_id(case, c, shown) for c in combos]
    # An oracle the case's own cells do not hold runs where some cell needs it; its id names what it varies.
    ids += [cell_id(case, c, shown | {a for a in ORACLE if c[a] != AXIS_DEFAULTS[a]})
            for c, _ in added]
    classes = [gpu_classes] * len(combos) + [tuple(g for g in gpu_classes if g in needed) for _, needed in added]
    combos = combos + [c for c, _ in added]
    index = {_key(c): i for i, c in reversed(list(enumerate(combos)))}  # the first of equal ones, as list.index
    baselines = [baseline_for(c, baseline, index, ids) for c in combos]
    twins = [ids[index[_key(no_draft(c))]] if c["speculative"] and _key(no_draft(c)) in index else None
             for c in combos]
    twin_ids = set(twins)
    cells = [Cell(ids[i], case, cell_axes(c), classes[i], source, baselines[i],
                  tuple((g, ids[o]) for g, o in oracles.get(i, {}).items()),
                  tuple((g, tuple(sorted(w))) for g, w in references.get(i, {}).items()),
                  draft_twin=twins[i], plain_twins=plain_twins(i, combos, index, ids, classes, pool),
                  twin_of_draft=ids[i] in twin_ids,
                  model_references=model_references(i, combos, reference, index, oracles, ids, classes),
                  added_reference=added_reference is not None
                  and _key(c, _SHARED_WITH_ORACLE) == _key(added_reference, _SHARED_WITH_ORACLE))
             for i, c in enumerate(combos)]
    serves: dict[str, set[str]] = {}
    for c in cells:
        for gpu_name, reference_id in c.model_references:
            serves.setdefault(reference_id, set()).add(gpu_name)
    cells = [replace(c, reference_for=tuple(sorted(serves[c.cell_id]))) if c.cell_id in serves else c for c in cells]
    ids = [c.cell_id for c in cells]
    if len(set(ids)) != len(ids):
        raise CaseError(source, case.name, "matrix", "two cells have the same id")
    return cells


def baseline_for(combo: dict[str, Any], baseline: dict[str, Any] | None, index: dict[tuple, int],
                 ids: list[str]) -> str | None:
    """The id of the accuracy baseline a combination is compared with: the baseline run in the combination's own
    execution and workload where the case has that cell (an eager twin against the eager twin of the baseline),
    else the baseline itself (`index`: each combination's position, by `_key`). Never the other way round: a
    baseline that is a differential cell waits for its eager oracle, so that oracle waiting for the baseline would
    stop both."""
    if baseline is None:
        return None
    same_mode = {**baseline, "execution": combo["execution"], "workload": combo["workload"]}
    return ids[index[_key(same_mode)]] if _key(same_mode) in index else ids[index[_key(baseline)]]


def model_references(i: int, combos: list[dict[str, Any]], reference: dict[str, Any] | None,
                     index: dict[tuple, int], oracles: dict[int, dict[str, int]], ids: list[str],
                     classes: list[tuple[str, ...]]) -> tuple[tuple[str, str], ...]:
    """(class, id) of the model reference a plain combination is compared with on each of its classes: the
    reference combination where it runs as its oracle would (eager), else its oracle there (its eager twin on a GPU
    class). None for the reference itself, a workload's cells (other prompts), or a case without one."""
    if reference is None or combos[i]["workload"] != "plain":
        return ()
    r = index[_key(reference)]
    out = []
    for gpu_name in classes[i]:
        there = oracles.get(r, {}).get(gpu_name, r)
        if there != i and gpu_name in classes[there]:
            out.append((gpu_name, ids[there]))
    return tuple(out)


_SHARED_WITH_ORACLE = tuple(a for a in AXES if a not in ORACLE)


def no_draft(combo: dict[str, Any]) -> dict[str, Any]:
    """A combination without its draft: its greedy outputs are what the draft cell's must be."""
    return {**combo, "speculative": None, **{axis: None for axis in DRAFT_AXES}}


def draft_twins_missing(combos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The no-draft twins of the draft combinations that `combos` lacks, each once, in order."""
    seen = {_key(c) for c in combos}
    missing: list[dict[str, Any]] = []
    for twin in (no_draft(c) for c in combos if c["speculative"]):
        if _key(twin) not in seen:
            seen.add(_key(twin))
            missing.append(twin)
    return missing


def plain_twins(index: int, combos: list[dict[str, Any]], positions: dict[tuple, int], ids: list[str],
                classes: list[tuple[str, ...]], pool: dict[str, GpuClass]) -> tuple[tuple[str, str], ...]:
    """(class, id) of a draft combination's plain twin on each of its classes: the same draft and parallel sizes,
    every other axis at its default, running eager and plain there (an explicit `eager` before `default`). None
    where the combination is its own plain twin or the case has no such cell (its acceptance is then only
    recorded). `positions`: each combination's position, by `_key` (a lookup per execution, not a scan)."""
    combo = combos[index]
    if not combo["speculative"]:
        return ()
    plain = {**AXIS_DEFAULTS, **{a: combo[a] for a in ("speculative", *RANK_AXES)}}
    candidates = [positions[k] for k in (_key({**plain, "execution": e}) for e in ("eager", "default"))
                  if k in positions]
    out = []
    for gpu_name in classes[index]:
        device = pool[gpu_name].device
        found = [j for j in candidates
                 if gpu_name in classes[j] and resolved_execution(combos[j]["execution"], device) == "eager"]
        if found and found[0] != index:
            out.append((gpu_name, ids[found[0]]))
    return tuple(out)


def _others(combo: dict[str, Any]) -> tuple:
    """A combination's axes other than execution and workload (what a cell and its oracle share)."""
    return _key(combo, _SHARED_WITH_ORACLE)


def _running_as_oracle(combos: list[dict[str, Any]], runs_as: Callable[[dict], tuple[str, str]],
                       want: tuple[str, str]) -> dict[tuple, int]:
    """The case's cells that run as the oracle on a class, by their other axes (`_others`): the first with an
    explicit execution, else the first with `default`. One pass: looking each cell's oracle up among all cells made
    expanding grow with the square of the cells."""
    found: dict[tuple, int] = {}
    for j, combo in enumerate(combos):
        if runs_as(combo) != want:
            continue
        seen = found.get(_others(combo))
        if seen is None or combos[seen]["execution"] == "default" != combo["execution"]:
            found[_others(combo)] = j
    return found


def differential_plan(case: Case, combos: list[dict[str, Any]], gpu_classes: tuple[str, ...],
                      pool: dict[str, GpuClass]) -> tuple[list[tuple[dict, set[str]]], dict, dict]:
    """Which cell is each cell's oracle on each class (matrix/expectations.py Differential): (oracle combinations
    to add, with the classes that need each; combination index -> {class: oracle index}; oracle index -> {class:
    workloads it generates plainly for its cells}). A cell whose execution on a class (`default` resolved for the
    class) and workload are the oracle's is compared with none; its oracle is the case's cell with the same other
    axes that runs as the oracle there (an explicit execution before `default`), or one added for those classes."""
    if case.differential is False:
        return [], {}, {}
    want = (case.differential.oracle.execution, case.differential.oracle.workload)
    added: list[tuple[dict, set[str]]] = []
    oracles: dict[int, dict[str, int]] = {}
    references: dict[int, dict[str, set[str]]] = {}
    twins: dict[tuple, int] = {}  # an added oracle's position in `added`, by `_key`
    for gpu_name in gpu_classes:
        device = pool[gpu_name].device

        def runs_as(combo: dict, device: str = device) -> tuple[str, str]:
            return resolved_execution(combo["execution"], device), combo["workload"]

        as_oracle = _running_as_oracle(combos, runs_as, want)
        for i, combo in enumerate(combos):
            if runs_as(combo) == want:
                continue
            if _others(combo) in as_oracle:
                oracle = as_oracle[_others(combo)]
            else:
                twin = {**combo, "execution": want[0], "workload": want[1]}
                if _key(twin) not in twins:
                    added.append((twin, set()))
                    twins[_key(twin)] = len(added) - 1
                added[twins[_key(twin)]][1].add(gpu_name)
                oracle = len(combos) + twins[_key(twin)]
            oracles.setdefault(i, {})[gpu_name] = oracle
            workloads = references.setdefault(oracle, {}).setdefault(gpu_name, set())
            if combo["workload"] != "plain":
                workloads.add(combo["workload"])
    return added, oracles, references


def expand_all(
    cases: list[Case], models: dict[str, ModelEntry], pool: dict[str, GpuClass]
) -> list[Cell]:
    cells: list[Cell] = []
    for case in cases:
        cells.extend(expand_case(case, models, pool))
    return cells
