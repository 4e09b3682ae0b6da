"""Longest first, by the earlier runs' timings: cells that failed last time first, then
groups of a model and backend, longest first; without timings the cases' order stays.

The order a run starts its cells in: baseline cells first (compared cells read their finished records); within
each of those two waves the cells that failed or errored in the previous run first (a run's first failures show
early), then cells that share a model and attention backend next to each other (the kernels one compiles serve
the others while they are still warm), groups with the longest cell first and each group longest first, so that
a long cell never starts last while the other slots sit idle. Expected costs come from the previous run's
timings (`history.last_timings`), previous verdicts from `history.last_verdicts`; a cell never timed costs
`default_s`, more than most, since it may compile cold."""

from __future__ import annotations

from dataclasses import replace

from kvmatrix.harness.record.parts import FAILING_VERDICTS
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.order.policy import StartContext, StartOrder

DEFAULT_COST_S = 60.0


def order_tasks(tasks: list[Task], expected_seconds: dict[str, float], default_s: float = DEFAULT_COST_S,
                last_verdicts: dict[str, str] | None = None) -> list[Task]:
    """`expected_seconds` maps a cell id to its expected seconds on the tasks' GPU class (the tasks of one run share
    a class), `last_verdicts` a cell id to its verdict in that class's previous run. Ties keep the given order,
    so an unknown matrix runs as written, grouped."""
    last_verdicts = last_verdicts or {}

    def cost(task: Task) -> float:
        return expected_seconds.get(task.cell.cell_id, default_s)

    def group(task: Task) -> tuple:
        return task.cell.model, task.cell.axes.get("attention_backend")

    def is_baseline(task: Task) -> bool:
        return task.cell.baseline_id == task.cell.cell_id

    def failed_last_time(task: Task) -> bool:
        return last_verdicts.get(task.cell.cell_id) in FAILING_VERDICTS

    def grouped(part: list[Task]) -> list[Task]:
        groups: dict[tuple, list[Task]] = {}
        for task in part:
            groups.setdefault(group(task), []).append(task)
        members = [sorted(g, key=cost, reverse=True) for g in groups.values()]  # sorted() is stable
        return [t for g in sorted(members, key=lambda g: cost(g[0]), reverse=True) for t in g]

    ordered: list[Task] = []
    for wave in ([t for t in tasks if is_baseline(t)], [t for t in tasks if not is_baseline(t)]):
        ordered += grouped([t for t in wave if failed_last_time(t)])
        ordered += grouped([t for t in wave if not failed_last_time(t)])
    return ordered


class LongestFirst:
    def order(self, draft: StartOrder, context: StartContext) -> StartOrder:
        past = context.past
        if past.expected_seconds is None:
            return draft
        ordered = order_tasks(list(draft.tasks), dict(past.expected_seconds), last_verdicts=dict(past.verdicts))
        return replace(draft, tasks=tuple(ordered))
