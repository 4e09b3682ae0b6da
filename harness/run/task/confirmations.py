"""Expected failures a fresh process confirmed in this run, so that their siblings can stay in warm workers.

A cell that a warm worker ran to anything but a pass is run again in a fresh process: a worker polluted by an
earlier cell must never decide a verdict. For an expected failure (xfail: a waiver or the case's `crash:` rule)
that costs a process start per cell, and a case often fails alike in every cell (on a cold H200, 12 `glm-fp8`
cells crashing at load spent 438 s in fresh processes). So the first cell of each case and reason (the waiver, the
`crash:` rule, the last run's verdict) is confirmed in a fresh process, and a sibling cell of that case whose
warm run ends in the same outcome (status and signature, judged xfail, no signal, the worker not retired) is
taken as it is, naming the cell that confirmed it: a polluted worker does not produce exactly the crash a clean
process just produced. A FAIL, an error, a timeout or a signal is always confirmed. Which cells wait for a
confirmation is the start order's (harness/run/order/confirmations.py)."""

from __future__ import annotations

import threading

from kvmatrix.harness.record.types import JudgedRecord


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
