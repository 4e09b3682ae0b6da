"""Which cell each cell of a case is compared with, as combinations of axis values: the accuracy baseline (the
model as it ships), the model reference (an unquantized cache, eager, plain), the differential oracle per GPU class
(matrix/expectations.py Differential: the case's cell that runs as the oracle there, or one added), and a draft
cell's speculative twins (its no-draft twin, its plain twin per class). matrix/expand.py makes cells of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvmatrix.matrix.axes import AXES, AXIS_DEFAULTS, DRAFT_AXES, ORACLE, RANK_AXES, resolved_execution
from kvmatrix.matrix.case import Case
from kvmatrix.matrix.combinations import combo_key
from kvmatrix.matrix.schema import GpuClass


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
    keys = {combo_key(c) for c in combos}
    if combo_key(plain) not in keys and combo_key({**plain, "kv_cache_dtype": "auto"}) in keys:
        return {**plain, "kv_cache_dtype": "auto"}
    return plain


def baseline_for(combo: dict[str, Any], baseline: dict[str, Any] | None, index: dict[tuple, int],
                 ids: list[str]) -> str | None:
    """The id of the accuracy baseline a combination is compared with: the baseline run in the combination's own
    execution and workload where the case has that cell (an eager twin against the eager twin of the baseline),
    else the baseline itself (`index`: each combination's position, by `combo_key`). Never the other way round: a
    baseline that is a differential cell waits for its eager oracle, so that oracle waiting for the baseline would
    stop both."""
    if baseline is None:
        return None
    same_mode = {**baseline, "execution": combo["execution"], "workload": combo["workload"]}
    return ids[index[combo_key(same_mode)]] if combo_key(same_mode) in index else ids[index[combo_key(baseline)]]


def model_references(i: int, combos: list[dict[str, Any]], reference: dict[str, Any] | None,
                     index: dict[tuple, int], oracles: dict[int, dict[str, int]], ids: list[str],
                     classes: list[tuple[str, ...]]) -> tuple[tuple[str, str], ...]:
    """(class, id) of the model reference a plain combination is compared with on each of its classes: the
    reference combination where it runs as its oracle would (eager), else its oracle there (its eager twin on a GPU
    class). None for the reference itself, a workload's cells (other prompts), or a case without one."""
    if reference is None or combos[i]["workload"] != "plain":
        return ()
    r = index[combo_key(reference)]
    out = []
    for gpu_name in classes[i]:
        there = oracles.get(r, {}).get(gpu_name, r)
        if there != i and gpu_name in classes[there]:
            out.append((gpu_name, ids[there]))
    return tuple(out)


SHARED_WITH_ORACLE = tuple(a for a in AXES if a not in ORACLE)


def no_draft(combo: dict[str, Any]) -> dict[str, Any]:
    """A combination without its draft: its greedy outputs are what the draft cell's must be."""
    return {**combo, "speculative": None, **{axis: None for axis in DRAFT_AXES}}


def draft_twins_missing(combos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The no-draft twins of the draft combinations that `combos` lacks, each once, in order."""
    seen = {combo_key(c) for c in combos}
    missing: list[dict[str, Any]] = []
    for twin in (no_draft(c) for c in combos if c["speculative"]):
        if combo_key(twin) not in seen:
            seen.add(combo_key(twin))
            missing.append(twin)
    return missing


def plain_twins(index: int, combos: list[dict[str, Any]], positions: dict[tuple, int], ids: list[str],
                classes: list[tuple[str, ...]], pool: dict[str, GpuClass]) -> tuple[tuple[str, str], ...]:
    """(class, id) of a draft combination's plain twin on each of its classes: the same draft and parallel sizes,
    every other axis at its default, running eager and plain there (an explicit `eager` before `default`). None
    where the combination is its own plain twin or the case has no such cell (its acceptance is then only
    recorded). `positions`: each combination's position, by `combo_key` (a lookup per execution, not a scan)."""
    combo = combos[index]
    if not combo["speculative"]:
        return ()
    plain = {**AXIS_DEFAULTS, **{a: combo[a] for a in ("speculative", *RANK_AXES)}}
    candidates = [positions[k] for k in (combo_key({**plain, "execution": e}) for e in ("eager", "default"))
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
    return combo_key(combo, SHARED_WITH_ORACLE)


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
    twins: dict[tuple, int] = {}  # an added oracle's position in `added`, by `combo_key`
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
                if combo_key(twin) not in twins:
                    added.append((twin, set()))
                    twins[combo_key(twin)] = len(added) - 1
                added[twins[combo_key(twin)]][1].add(gpu_name)
                oracle = len(combos) + twins[combo_key(twin)]
            oracles.setdefault(i, {})[gpu_name] = oracle
            workloads = references.setdefault(oracle, {}).setdefault(gpu_name, set())
            if combo["workload"] != "plain":
                workloads.add(combo["workload"])
    return added, oracles, references
