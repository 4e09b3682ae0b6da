"""Each cell after what it waits for, and the cells that start ahead of all (`first`: the canary, a cold run's JIT
pilots and their model references) in front, waiting only for those in front before them: the last policy, which
places what the others decided."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.order.policy import StartContext, StartOrder


class PrerequisitesFirst:
    def order(self, draft: StartOrder, context: StartContext) -> StartOrder:
        placed = prerequisites_first(list(draft.tasks), draft.waits)
        # A task in front waits only for those in front before it (a leading pilot, for its model reference).
        before = {t.key: {f.key for f in draft.first[:i]} for i, t in enumerate(draft.first)}
        waits = {key: frozenset(keys & before[key]) if key in before else keys for key, keys in draft.waits.items()}
        first = set(before)
        return replace(draft, tasks=draft.first + tuple(t for t in placed if t.key not in first), waits=waits, first=())


def prerequisites_first(tasks: list[Task], waits: Mapping[str, frozenset[str] | set[str]]) -> list[Task]:
    """The tasks in the given order, each preceded by the tasks it waits for (transitively) that are not placed
    yet: a cell that an early cell waits for starts early too (on a cold H200 the confirmation of an fp8_e5m2
    cell started first and waited for its eager oracle, 89th in the order: a 180 s FlashInfer build that then
    started half-way through the run)."""
    by_key = {t.key: t for t in tasks}
    position = {t.key: i for i, t in enumerate(tasks)}
    placed: list[Task] = []
    seen: set[str] = set()

    def place(task: Task) -> None:
        if task.key in seen:
            return
        seen.add(task.key)
        for key in sorted(waits.get(task.key, ()) & by_key.keys(), key=position.__getitem__):
            place(by_key[key])
        placed.append(task)

    for task in tasks:
        place(task)
    return placed
