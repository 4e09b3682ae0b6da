"""Longest first, by the earlier runs' timings (harness/run/schedule.py): cells that failed last time first, then
groups of a model and backend, longest first; without timings the cases' order stays."""

from __future__ import annotations

from dataclasses import replace

from kvmatrix.harness.run.order.policy import StartContext, StartOrder
from kvmatrix.harness.run.schedule import order_tasks


class LongestFirst:
    def order(self, draft: StartOrder, context: StartContext) -> StartOrder:
        past = context.past
        if past.expected_seconds is None:
            return draft
        ordered = order_tasks(list(draft.tasks), dict(past.expected_seconds), last_verdicts=dict(past.verdicts))
        return replace(draft, tasks=tuple(ordered))
