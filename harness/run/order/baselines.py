"""Baselines first (harness/run/accuracy_plan.py): a cell compared with another (its accuracy baseline, its
differential oracle, its speculative twins) waits for it; cells that would wait for each other are an error named
before any runs, not after the rest."""

from __future__ import annotations

from kvmatrix.harness.run.accuracy_plan import baseline_gates, baselines_first
from kvmatrix.harness.run.order.policy import StartContext, StartOrder


class BaselinesFirst:
    def order(self, draft: StartOrder, context: StartContext) -> StartOrder:
        tasks = list(draft.tasks)
        baselines_first(tasks)  # raises on cells that wait for each other
        return draft.with_waits(baseline_gates(tasks))
