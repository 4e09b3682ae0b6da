"""Expanding cases into cells: the cross product of a case's axes, minus `exclude:`, plus `include:` (the CI
matrix idea), each cell with a stable, readable id and the GPU classes of the pool it applies to."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from kvmatrix.matrix.axes import (
    AXES,
    AXIS_DEFAULTS,
    AXIS_ID_NAMES,
    OPTIONAL_ID_AXES,
    Axes,
    cell_axes,
    resolved_execution,
)
from kvmatrix.matrix.case import Case
from kvmatrix.matrix.conditions import gpu_matches, matches, when_matches
from kvmatrix.matrix.messages import did_you_mean, one_of
from kvmatrix.matrix.schema import CaseError, GpuClass, ModelEntry


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

    @property
    def model(self) -> str:
        return self.case.model

    @property
    def gpus_needed(self) -> int:
        """GPUs of its class one engine of this cell spans (tensor x pipeline parallel ranks)."""
        return self.axes["tensor_parallel_size"] * self.axes["pipeline_parallel_size"]

    def oracle_on(self, gpu_name: str) -> str | None:
        """The oracle this cell is compared with on that class (None: it is compared with none there)."""
        return dict(self.oracles).get(gpu_name)

    def references_on(self, gpu_name: str) -> tuple[str, ...]:
        """The workloads whose prompts this cell generates plainly on that class, as their cells' oracle."""
        return dict(self.references).get(gpu_name, ())

    def is_oracle_on(self, gpu_name: str) -> bool:
        return gpu_name in dict(self.references)

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


def baseline_axes(case: Case) -> dict[str, Any] | None:
    """The axes of the cell that every accuracy cell of the case is compared with: the model as it ships."""
    if case.accuracy is None:
        return None
    return {**AXIS_DEFAULTS, "kv_cache_dtype": case.accuracy.baseline_kv_cache_dtype}


def cell_id(case: Case, axes: dict[str, Any], shown_optional: frozenset[str] = frozenset()) -> str:
    def show(axis: str, value: Any) -> str:
        if value is None or value == []:
            return "-"
        return "+".join(value) if isinstance(value, list) else str(value)

    shown = [a for a in AXES if a not in OPTIONAL_ID_AXES or a in shown_optional]
    return f"{case.name}[" + ",".join(f"{AXIS_ID_NAMES[a]}={show(a, axes[a])}" for a in shown) + "]"


def combinations(case: Case) -> list[dict[str, Any]]:
    m = case.matrix
    product = [dict(zip(AXES, values, strict=True)) for values in itertools.product(*(getattr(m, a) for a in AXES))]
    kept = [
        combo for combo in product
        if not any(all(matches(v, combo[k]) for k, v in ex.given().items()) for ex in m.exclude)
    ]
    for inc in m.include:
        combo = {**AXIS_DEFAULTS, **inc.given()}
        if combo not in kept:
            kept.append(combo)
    return kept


def classes_for(case: Case, pool: dict[str, GpuClass]) -> tuple[str, ...]:
    return tuple(
        name for name, gpu in pool.items()
        if any(gpu_matches(cond, {"name": name, **gpu.model_dump()}) for cond in case.gpus)
    )


def expand_case(
    case: Case, models: dict[str, ModelEntry], pool: dict[str, GpuClass], source: str = ""
) -> list[Cell]:
    source = source or f"cases/{case.name}.yaml"
    if case.model not in models:
        raise CaseError(source, case.name, "model", f"{case.model!r} is not in the model registry"
                        f"{did_you_mean(case.model, models)}; the registry: {one_of(models)} (`kvmatrix models` "
                        f"describes each)")
    for i, draft in enumerate(case.matrix.speculative + [c.speculative for c in case.matrix.include]):
        if draft is not None and (draft not in models or models[draft].draft is None):
            field_name = "matrix.speculative" if i < len(case.matrix.speculative) else "matrix.include"
            drafts = [name for name, entry in models.items() if entry.draft is not None]
            raise CaseError(source, case.name, field_name, f"{draft!r} is not a draft model in the registry"
                            f"{did_you_mean(draft, drafts)}; drafts: {one_of(drafts)}")
    gpu_classes = classes_for(case, pool)
    if not gpu_classes:
        raise CaseError(source, case.name, "gpus", f"matches no GPU class of the pool ({sorted(pool)})")
    combos = combinations(case)
    baseline = baseline_axes(case)
    if baseline is not None and baseline not in combos:
        combos.insert(0, baseline)  # a compared cell needs its baseline in the same run
    shown = frozenset(a for a in OPTIONAL_ID_AXES if any(c[a] != AXIS_DEFAULTS[a] for c in combos))
    added, oracles, references = differential_plan(case, combos, gpu_classes, pool)
    ids = [cell_id(case, c, shown) for c in combos]
    # An oracle the case's own cells do not hold runs where some cell needs it; its id names what it varies.
    ids += [cell_id(case, c, shown | {a for a in ("execution", "workload") if c[a] != AXIS_DEFAULTS[a]})
            for c, _ in added]
    classes = [gpu_classes] * len(combos) + [tuple(g for g in gpu_classes if g in needed) for _, needed in added]
    combos = combos + [c for c, _ in added]
    baselines = [baseline_for(c, baseline, combos, ids) for c in combos]
    cells = [Cell(ids[i], case, cell_axes(c), classes[i], source, baselines[i],
                  tuple((g, ids[o]) for g, o in oracles.get(i, {}).items()),
                  tuple((g, tuple(sorted(w))) for g, w in references.get(i, {}).items()))
             for i, c in enumerate(combos)]
    ids = [c.cell_id for c in cells]
    if len(set(ids)) != len(ids):
        raise CaseError(source, case.name, "matrix", "two cells have the same id")
    return cells


def baseline_for(combo: dict[str, Any], baseline: dict[str, Any] | None, combos: list[dict[str, Any]],
                 ids: list[str]) -> str | None:
    """The id of the accuracy baseline a combination is compared with: the baseline run in the combination's own
    execution and workload where the case has that cell (an eager twin against the eager twin of the baseline),
    else the baseline itself. Never the other way round: a baseline that is a differential cell waits for its
    eager oracle, so that oracle waiting for the baseline would stop both."""
    if baseline is None:
        return None
    same_mode = {**baseline, "execution": combo["execution"], "workload": combo["workload"]}
    return ids[combos.index(same_mode)] if same_mode in combos else ids[combos.index(baseline)]


def _others(combo: dict[str, Any]) -> tuple:
    """A combination's axes other than execution and workload (what a cell and its oracle share)."""
    return tuple(repr(combo[a]) for a in AXES if a not in ("execution", "workload"))


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
    for gpu_name in gpu_classes:
        device = pool[gpu_name].device

        def runs_as(combo: dict, device: str = device) -> tuple[str, str]:
            return resolved_execution(combo["execution"], device), combo["workload"]

        for i, combo in enumerate(combos):
            if runs_as(combo) == want:
                continue
            same = [j for j, o in enumerate(combos) if _others(o) == _others(combo) and runs_as(o) == want]
            same.sort(key=lambda j: combos[j]["execution"] == "default")
            if same:
                oracle = same[0]
            else:
                twin = {**combo, "execution": want[0], "workload": want[1]}
                index = next((k for k, (c, _) in enumerate(added) if c == twin), None)
                if index is None:
                    added.append((twin, set()))
                    index = len(added) - 1
                added[index][1].add(gpu_name)
                oracle = len(combos) + index
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
