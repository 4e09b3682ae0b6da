"""Rules that can never apply (`kvmatrix check`): a `when:` of a skip rule, an expectation or an expected accuracy
drop that matches none of the case's cells on any of its GPU classes, and an `exclude:` entry that matches no
combination of its axes. Such a rule passes silently and tests nothing: `speculative: eagle3` in a case without
that draft, `kv_cache_dtype: bf16` (vLLM says `bfloat16`). A rule scoped by vLLM release or emulation is judged on
its other keys (which release runs is not the case file's to know)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvmatrix.matrix.case import Case
from kvmatrix.matrix.combinations import cross_product
from kvmatrix.matrix.conditions import matches, when_matches
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.messages import did_you_mean
from kvmatrix.matrix.schema import GpuClass

# Keys a case file cannot be judged on alone: which vLLM release runs, and whether a class is emulated.
RUN_TIME_KEYS = ("vllm_version", "emulated")


@dataclass(frozen=True)
class DeadRule:
    field: str  # where in the case file, as CaseError names fields: `skip.0.when.speculative`
    message: str


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return "+".join(map(str, value)) or "[]"
    return "null" if value is None else str(value)


def _values_of(key: str, contexts: list[dict]) -> list[str]:
    """What the case's cells hold for a `when:` key (the class names for `gpu`)."""
    seen = (ctx["gpu"]["name"] if key == "gpu" else _shown(ctx.get(key)) for ctx in contexts)
    return sorted(set(seen))


def _why_dead(where: str, when: dict, contexts: list[dict], names: Mapping[str, Iterable[str]]) -> list[DeadRule]:
    """Each key whose value alone matches no cell, with the values the cells have (and the name meant, where a
    name is known to vLLM or the registry); or the clause as a whole where only its keys together match none."""
    dead = []
    for key, value in when.items():
        if not any(when_matches({key: value}, ctx) for ctx in contexts):
            hint = did_you_mean(value, names.get(key, ())) if isinstance(value, str) else ""
            dead.append(DeadRule(f"{where}.{key}", f"{value!r} matches no cell{hint}: this case's cells have "
                                                   f"{key} {', '.join(_values_of(key, contexts))}"))
    return dead or [DeadRule(where, f"{when} matches no cell: each key matches some cell, never all together")]


def _when_clauses(case: Case) -> list[tuple[str, dict]]:
    clauses = [(f"skip.{i}.when", rule.when) for i, rule in enumerate(case.skip)]
    clauses += [(f"expect.{i}.when", rule.when) for i, rule in enumerate(case.expect)]
    if case.accuracy is not None:
        clauses += [(f"accuracy.expected_drops.{i}.when", drop.when)
                    for i, drop in enumerate(case.accuracy.expected_drops)]
    return clauses


def _dead_excludes(case: Case, names: Mapping[str, Iterable[str]]) -> list[DeadRule]:
    """`exclude:` entries that remove no combination of the case's axes."""
    product = cross_product(case)
    dead = []
    for i, entry in enumerate(case.matrix.exclude):
        given = entry.given()
        if any(all(matches(v, combo[k]) for k, v in given.items()) for combo in product):
            continue
        for key, value in given.items():
            if not any(matches(value, combo[key]) for combo in product):
                # A name vLLM or the registry knows is no typo, just not varied here: suggesting another such name
                # (llama-eagle3-gqa4 for llama-eagle3) would mislead.
                known = list(names.get(key, ()))
                hint = did_you_mean(value, known) if isinstance(value, str) and value not in known else ""
                values = ", ".join(sorted({_shown(combo[key]) for combo in product}))
                dead.append(DeadRule(f"matrix.exclude.{i}.{key}",
                                     f"{value!r} is no value of this case's {key} ({values}){hint}: it excludes "
                                     f"nothing"))
    return dead


def dead_rules(case: Case, cells: list[Cell], pool: Mapping[str, GpuClass],
               names: Mapping[str, Iterable[str]] | None = None) -> list[DeadRule]:
    """Every rule of `case` that none of its `cells` (on their classes of `pool`) can meet. `names`: the names
    vLLM or the registry knows per key (`kv_cache_dtype`, `speculative`, ...), for "did you mean"."""
    names = names or {}
    contexts = [cell.context(gpu, pool[gpu], None, False) for cell in cells for gpu in cell.gpu_classes]
    dead = _dead_excludes(case, names)
    for where, when in _when_clauses(case):
        judged = {k: v for k, v in when.items() if k not in RUN_TIME_KEYS}
        if contexts and not any(when_matches(judged, ctx) for ctx in contexts):
            dead += _why_dead(where, judged, contexts, names)
    return dead
