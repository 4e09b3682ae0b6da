"""What the generated surface cells found (cases/surface/, harness/surface/cases.py): each judged record set
against vLLM's declaration for its point, one kind of broken promise per mismatch:
- `crashed although declared`: declared supported, the engine crashed;
- `refused although declared`: declared supported, vLLM refused it at start, clearly (its start-up checks know
  more than the backend's declaration says);
- `ran another way`: declared supported, it ran, but not that backend with that dtype (a forced backend replaced);
- `accepted although refused`: declared unsupported, vLLM started and decoded anyway (no validation on that path);
- `crashed instead of refusing`: declared unsupported, vLLM accepted it at start and crashed later.
A pass is a kept promise; a clear refusal where the platform may refuse is one too."""

from __future__ import annotations

from collections import Counter

from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.surface.cases import REFUSALS
from kvmatrix.matrix.conditions import when_matches
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.schema import GpuClass

KINDS = ("crashed although declared", "refused although declared", "ran another way", "accepted although refused",
         "crashed instead of refusing")


def declared_supported(task: Task, vllm_version: str | None) -> bool:
    """Whether the case's rules for this task say vLLM declared the point supported (no required refusal)."""
    context = task.context(vllm_version)
    return not any(rule.refuse is not None and not rule.refuse.optional and when_matches(rule.when, context)
                   for rule in task.cell.case.expect)


def promised(tasks: list[Task], vllm_version: str | None) -> list[Task]:
    """The tasks whose case requires no refusal: for generated surface cases, the points vLLM declares supported,
    which a short GPU lease runs first (`kvmatrix run --declared-only`)."""
    return [t for t in tasks if declared_supported(t, vllm_version)]


def refusals(tasks: list[Task], vllm_version: str | None) -> list[Task]:
    """The other tasks: for generated surface cases, the points vLLM declares refused (`kvmatrix run
    --refused-only`), which a later lease runs where a short one ran the promises."""
    return [t for t in tasks if not declared_supported(t, vllm_version)]


def promise_verdict(record: JudgedRecord) -> str:
    """The verdict a promise is judged by: a known vLLM failure that explained a failure of a surface case from
    outside the built-in cases (harness/judge/known_failures.py) still broke its promise."""
    return (record.get("known_failure") or {}).get("verdict") or record["verdict"]


def broken_promise(record: JudgedRecord, task: Task) -> str | None:
    """The kind of broken promise a judged surface record shows, or None (kept, or nothing to judge)."""
    if promise_verdict(record) != "fail":
        return None
    crashed = record.get("status") != "ok"
    if declared_supported(task, record.get("vllm_version")):
        if not crashed:
            return "ran another way"
        return "refused although declared" if record.get("signature") in REFUSALS else "crashed although declared"
    return "crashed instead of refusing" if crashed else "accepted although refused"


def promise_table(records: list[JudgedRecord], cells: dict[str, Cell], pool: dict[str, GpuClass]) -> list[list]:
    """Per class: surface cells run, promises kept, and each kind of broken promise."""
    rows: dict[str, Counter] = {}
    for record in records:
        cell, gpu = cells.get(record["cell_id"]), record.get("gpu_class")
        if cell is None or gpu not in pool or record["verdict"] == "skip":
            continue
        counts = rows.setdefault(gpu, Counter())
        counts["run"] += 1
        kind = broken_promise(record, Task(cell, gpu, pool[gpu], record.get("emulated_from")))
        counts[kind or ("kept" if promise_verdict(record) in ("pass", "xfail") else "not judged")] += 1
    return [[gpu, c["run"], c["kept"], *(c[k] for k in KINDS), c["not judged"]] for gpu, c in rows.items()]


HEADERS = ["class", "cells run", "promises kept", *KINDS, "not judged (error)"]
