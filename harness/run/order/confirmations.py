"""Confirmations first: in a warm run, the cells of a case expected not to pass for
one reason wait for the first of them, whose fresh process confirms the failure; those first cells start ahead of
the rest, since each holds back a chain (on a cold H200 the glm-fp8 confirmation, last in a longest-first order,
held its 11 siblings to the end of the run). What a confirmation is, and the ones a run has made, are
harness/run/task/confirmations.py's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.order.policy import StartContext, StartOrder


def confirmation_gates(tasks: Iterable[Task], expected_failure: dict[str, str | None]) -> dict[str, set[str]]:
    """Which task keys each task waits for: the cells of a case expected not to pass for one reason (`expected_failure`:
    task key → why, or None) wait for the first of them in `tasks`' order, whose fresh process confirms it. Cells
    expected to fail for other reasons (other waivers: another crash) do not wait for each other."""
    first: dict[tuple[str, str], str] = {}
    waits: dict[str, set[str]] = {}
    for task in tasks:
        waits[task.key] = set()
        why = expected_failure.get(task.key)
        if why is None:
            continue
        group = (task.cell.case.name, why)
        if group in first:
            waits[task.key].add(first[group])
        else:
            first[group] = task.key
    return waits


class ConfirmationsAhead:
    def order(self, draft: StartOrder, context: StartContext) -> StartOrder:
        if context.settings.isolation != "worker":
            return draft
        confirming = confirmation_gates(draft.tasks, dict(context.expected_failure))
        heads = set().union(*confirming.values())
        tasks = [t for t in draft.tasks if t.key in heads] + [t for t in draft.tasks if t.key not in heads]
        return replace(draft, tasks=tuple(tasks), waits=add_acyclic(draft.waits, confirming))


def add_acyclic(waits: Mapping[str, frozenset[str]], more: Mapping[str, set[str]]) -> dict[str, frozenset[str]]:
    """`waits` with the waits of `more` added, each unless it would close a cycle (cells waiting for each other
    would never start)."""
    merged = {key: set(keys) for key, keys in waits.items()}

    def reaches(start: str, target: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            key = stack.pop()
            if key == target:
                return True
            if key not in seen:
                seen.add(key)
                stack.extend(merged.get(key, ()))
        return False

    for key, keys in more.items():
        for other in keys:
            if not reaches(other, key):
                merged.setdefault(key, set()).add(other)
    return {key: frozenset(keys) for key, keys in merged.items()}
