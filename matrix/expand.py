"""Expanding cases into cells: each case's combinations (matrix/combinations.py) with the cells they are compared
with (matrix/compared.py), each cell with a stable, readable id and the GPU classes of the pool it applies to."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvmatrix.matrix.axes import AXIS_DEFAULTS, AXIS_TABLE, DRAFT_AXES, OPTIONAL_ID_AXES, ORACLE, cell_axes, value_text
from kvmatrix.matrix.case import Case
from kvmatrix.matrix.cell import Cell
from kvmatrix.matrix.combinations import MAX_CELLS, case_values, check_size, combinations, combo_key
from kvmatrix.matrix.compared import (
    SHARED_WITH_ORACLE,
    baseline_axes,
    baseline_for,
    differential_plan,
    draft_twins_missing,
    model_references,
    no_draft,
    plain_twins,
    reference_axes,
)
from kvmatrix.matrix.conditions import gpu_matches
from kvmatrix.matrix.messages import did_you_mean, one_of
from kvmatrix.matrix.schema import CaseError, GpuClass, ModelEntry, every_problem

__all__ = ["MAX_CELLS", "Cell", "expand_all", "expand_case"]


def added_cells(cells: list[Cell]) -> dict[str, str]:
    """The cells of `cells` that their case's matrix does not list, by id, each with why kvmatrix adds it."""
    listed = {case.name: {combo_key(c) for c in combinations(case)} for case in {cell.case.name: cell.case
                                                                           for cell in cells}.values()}
    oracles = {oracle for cell in cells for _, oracle in cell.oracles}
    baselines = {cell.baseline_id for cell in cells}
    added = {}
    for cell in cells:
        if combo_key(dict(cell.axes)) in listed[cell.case.name]:
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


def cell_id(case: Case, axes: dict[str, Any], shown_optional: frozenset[str] = frozenset()) -> str:
    """`case[kv=fp8,skip=-,spec=-]`: every axis named in every id, then those of `shown_optional`, in the table's
    order."""
    shown = [a for a in AXIS_TABLE if a.in_every_id or a.name in shown_optional]
    return f"{case.name}[" + ",".join(f"{a.id_key}={value_text(axes[a.name])}" for a in shown) + "]"


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
    index = {combo_key(c): i for i, c in reversed(list(enumerate(combos)))}  # the first of equal ones, as list.index
    baselines = [baseline_for(c, baseline, index, ids) for c in combos]
    twins = [ids[index[combo_key(no_draft(c))]] if c["speculative"] and combo_key(no_draft(c)) in index else None
             for c in combos]
    twin_ids = set(twins)
    cells = [Cell(ids[i], case, cell_axes(c), classes[i], source, baselines[i],
                  tuple((g, ids[o]) for g, o in oracles.get(i, {}).items()),
                  tuple((g, tuple(sorted(w))) for g, w in references.get(i, {}).items()),
                  draft_twin=twins[i], plain_twins=plain_twins(i, combos, index, ids, classes, pool),
                  twin_of_draft=ids[i] in twin_ids,
                  model_references=model_references(i, combos, reference, index, oracles, ids, classes),
                  added_reference=added_reference is not None
                  and combo_key(c, SHARED_WITH_ORACLE) == combo_key(added_reference, SHARED_WITH_ORACLE))
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


def expand_all(
    cases: list[Case], models: dict[str, ModelEntry], pool: dict[str, GpuClass]
) -> list[Cell]:
    cells: list[Cell] = []
    for case in cases:
        cells.extend(expand_case(case, models, pool))
    return cells
