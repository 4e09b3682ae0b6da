"""Confirmations first (harness/run/confirmations.py): in a warm run, the cells of a case expected not to pass for
one reason wait for the first of them, whose fresh process confirms the failure; those first cells start ahead of
the rest, since each holds back a chain (on a cold H200 the glm-fp8 confirmation, last in a longest-first order,
held its 11 siblings to the end of the run)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kvmatrix.harness.run.confirmations import confirmation_gates
from kvmatrix.harness.run.order.policy import StartContext, StartOrder


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
