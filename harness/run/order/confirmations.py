"""Confirmations first: in a warm run, the cells of a case expected not to pass for
one reason wait for the first of them, whose fresh process confirms the failure; those first cells start ahead of
the rest, since each holds back a chain (on a cold H200 the glm-fp8 confirmation, last in a longest-first order,
held its 11 siblings to the end of the run).

Expected failures a fresh process confirmed in this run, so that their siblings can stay in warm workers.

A cell that a warm worker ran to anything but a pass is run again in a fresh process: a worker polluted by an
earlier cell must never decide a verdict. For an expected failure (xfail: a waiver or the case's `crash:` rule)
that costs a process start per cell, and a case often fails alike in every cell (on a cold H200, 12 `glm-fp8`
cells crashing at load spent 438 s in fresh processes). So the first cell of each case and reason (the waiver, the
`crash:` rule, the last run's verdict) is confirmed in a fresh process, and a sibling cell of that case whose
warm run ends in the same outcome (status and signature, judged xfail, no signal, the worker not retired) is
taken as it is, naming the cell that confirmed it: a polluted worker does not produce exactly the crash a clean
process just produced. A FAIL, an error, a timeout or a signal is always confirmed."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace

from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.run.order.policy import StartContext, StartOrder


def _outcome(record: JudgedRecord) -> tuple:
    return record["case"], record.get("status"), record.get("signature")


class Confirmations:
    def __init__(self) -> None:
        self._by_outcome: dict[tuple, str] = {}
        self._groups: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def add(self, record: JudgedRecord, why: str | None) -> None:
        """Keep a fresh process's expected failure as the confirmation of its case's outcome; `why` it was
        expected (None: it was not) names the group of cells it confirms for."""
        if record.get("isolation") == "process" and _confirmable(record):
            with self._lock:
                self._by_outcome.setdefault(_outcome(record), record["cell_id"])
                if why is not None:
                    self._groups.add((record["case"], why))

    def confirmed_by(self, record: JudgedRecord) -> str | None:
        """The cell whose fresh process ended as this warm run did; None: this run needs its own fresh process."""
        if not _confirmable(record):
            return None
        with self._lock:
            return self._by_outcome.get(_outcome(record))

    def has_group(self, case: str, why: str) -> bool:
        """Whether a fresh process already confirmed a failure of this case expected for this reason."""
        with self._lock:
            return (case, why) in self._groups


def _confirmable(record: JudgedRecord) -> bool:
    """An expected failure that ended as a Python exception or a judged result, in a process that stayed fit to
    run on: a signal, or a worker that retired after the cell (a CUDA error, memory kept), is never taken."""
    return (record.get("verdict") == "xfail" and record.get("status") in ("ok", "crash")
            and not record.get("signal") and not (record.get("worker") or {}).get("retired"))


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
