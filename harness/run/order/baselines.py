"""Baselines first: a cell compared with another (its accuracy baseline, its
differential oracle, its speculative twins) waits for it; cells that would wait for each other are an error named
before any runs, not after the rest."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from kvmatrix.harness.record.neighbours import neighbour_ids
from kvmatrix.harness.run.order.policy import StartContext, StartOrder


def baselines_first(tasks: list) -> list[list]:
    """Waves (each may run in parallel), each task in the first wave after every task it waits for
    (`baseline_gates`: its neighbours, record/neighbours.py): every cell compared with another runs
    after it. Tasks that wait for each other are an error of the plan, named before anything runs."""
    return in_waves(tasks, baseline_gates(tasks))


def in_waves(tasks: list, waits: Mapping[str, AbstractSet[str]]) -> list[list]:
    """The tasks in waves, each task in the first wave after every task key `waits` names for it (one that no task
    of the list has is waited for no more), each wave in the given order; tasks waiting for each other raise."""
    waves: list[list] = []
    done: set[str] = set()
    keys = {t.key for t in tasks}
    left = list(tasks)
    while left:
        wave = [t for t in left if waits.get(t.key, set()) & keys <= done]
        if not wave:
            raise ValueError(f"cells wait for each other: {[t.key for t in left][:5]}")
        waves.append(wave)
        done |= {t.key for t in wave}
        left = [t for t in left if t.key not in done]
    return waves


def baseline_gates(tasks: list) -> dict[str, set[str]]:
    """Which task keys each task waits for: a compared cell, its neighbours' tasks (record/neighbours.py: its
    accuracy baseline, differential oracle, speculative twins), when those run too (the same GPU class; one
    already recorded waits for nothing)."""
    keys = {(t.cell.cell_id, t.gpu_name): t.key for t in tasks}
    return {t.key: {keys[(o, t.gpu_name)] for o in neighbour_ids(t.cell, t.gpu_name).values()
                    if (o, t.gpu_name) in keys} for t in tasks}


class BaselinesFirst:
    def order(self, draft: StartOrder, context: StartContext) -> StartOrder:
        tasks = list(draft.tasks)
        baselines_first(tasks)  # raises on cells that wait for each other
        return draft.with_waits(baseline_gates(tasks))
