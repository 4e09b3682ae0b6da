"""What a start-order policy sees and gives: the tasks in their order so far and which task keys each waits for
(`StartOrder`), the run's facts it may consult (`StartContext`); each policy returns a new `StartOrder`."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Protocol

from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.run.settings import RunSettings


@dataclass(frozen=True)
class PastRuns:
    """What earlier runs of this class saw, by cell id: its seconds (None: no timings were asked for, the cells
    keep the cases' order), its verdict and the backend vLLM picked (from the history, or the last run on these
    caches: harness/run/last_run.py)."""

    expected_seconds: Mapping[str, float] | None = None
    verdicts: Mapping[str, str] = field(default_factory=dict)
    backends: Mapping[str, str] = field(default_factory=dict)

    @property
    def timed(self) -> bool:
        """Whether the order is a history's (longest first): then no pilot moves ahead of it."""
        return bool(self.expected_seconds)


@dataclass(frozen=True)
class StartContext:
    """The run's facts the policies consult: its settings, why each task is expected not to pass (task key → why,
    None: it is expected to), its slots, this machine's GPUs a cell may span, the earlier runs, and the records of
    the run folder already finished (a resumed run)."""

    settings: RunSettings
    expected_failure: Mapping[str, str | None]
    slots: int = 1
    devices: int = 0
    past: PastRuns = PastRuns()
    finished: tuple[JudgedRecord, ...] = ()


@dataclass(frozen=True)
class StartOrder:
    """The one-GPU cells in the order they start and the task keys each waits for; `first`: cells that start
    ahead of all, waiting for nothing (the canary, a cold run's long JIT pilots), placed there once every policy
    ran; `wide`: cells spanning several GPUs, run after the others on whole GPUs."""

    tasks: tuple[Task, ...]
    waits: Mapping[str, frozenset[str]]
    first: tuple[Task, ...] = ()
    wide: tuple[Task, ...] = ()
    canary: Task | None = None  # the cell whose run says whether this environment can be judged (canary.py)
    # Why each task is expected not to pass (the context's, None: it is expected to): a warm run starts such a cell
    # in a fresh process while its case's failure is not confirmed yet (harness/run/task/runner.py).
    expected_failure: Mapping[str, str | None] = field(default_factory=dict)

    @classmethod
    def given(cls, tasks: list[Task]) -> StartOrder:
        """The tasks in the order given, none waiting for another."""
        return cls(tuple(tasks), {t.key: frozenset() for t in tasks})

    def with_waits(self, more: Mapping[str, set[str]]) -> StartOrder:
        """Each task waiting for what it waited for and for `more` of it."""
        return replace(self, waits={key: keys | more.get(key, set()) for key, keys in self.waits.items()})

    def without(self, finished: AbstractSet[str]) -> StartOrder:
        """The order less the tasks `finished` names (task keys: recorded since the order was made), which no
        task waits for any more; no canary if it is one of them."""
        def left(tasks: tuple[Task, ...]) -> tuple[Task, ...]:
            return tuple(t for t in tasks if t.key not in finished)
        return replace(self, tasks=left(self.tasks), first=left(self.first), wide=left(self.wide),
                       waits={key: keys - finished for key, keys in self.waits.items() if key not in finished},
                       canary=None if self.canary is None or self.canary.key in finished else self.canary)


class StartPolicy(Protocol):
    def order(self, draft: StartOrder, context: StartContext) -> StartOrder:
        """The order with this policy's moves and waits added."""
        ...
