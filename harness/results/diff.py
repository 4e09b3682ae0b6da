"""What changed between two runs: new failures, fixed cells, other verdict changes, records whose resolved state
moved while the verdict stayed (a backend switch, a new page size or query dtype is a regression waiting to be
noticed), cells new in this run, and cells of the baseline that this run has no record of. Pure logic over
records, keyed by (GPU class, cell id).

A run may select only some cells (`kvmatrix run -k ...`, `--case`, `--cell`) and nothing it records says which
it selected, so a baseline cell missing from the run is not called gone: it is "not in this run" (not selected,
or no longer in the matrix), listed apart, and does not make the diff non-empty. Only cells present in both
runs are compared.
New failures that share a crash fingerprint are listed together, each saying how many other cells of the run
crashed the same way (and, given the history's first sightings, since when)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kvmatrix.harness.judge.facts import facts
from kvmatrix.harness.record.files import run_mode
from kvmatrix.harness.record.parts import FAILING_VERDICTS
from kvmatrix.harness.record.types import JudgedRecord


@dataclass(frozen=True)
class Change:
    gpu_class: str
    cell_id: str
    before: str | None  # verdict in the baseline; None: the cell was not there
    after: str | None  # verdict now; None: the run has no record of the cell
    what: tuple[str, ...] = ()  # "kv bfloat16 → fp8", ...
    reason: str = ""  # the current record's reason (the baseline's for a cell not in this run)
    flaky: bool = False
    fingerprint: str | None = None  # the current record's crash (harness/judge/fingerprint.py)
    same_crash: int = 0  # other cells of the current run with that fingerprint
    first_seen: str | None = None  # the run the fingerprint was first seen in (history database)


@dataclass
class Diff:
    new_failures: list[Change] = field(default_factory=list)
    fixed: list[Change] = field(default_factory=list)
    verdict_changed: list[Change] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)  # same verdict, different resolved state
    appeared: list[Change] = field(default_factory=list)
    still_failing: list[Change] = field(default_factory=list)
    not_in_run: list[Change] = field(default_factory=list)  # in the baseline only: not selected, or removed
    unchanged: int = 0

    SECTIONS = (
        ("new_failures", "New failures"),
        ("fixed", "Fixed"),
        ("verdict_changed", "Other verdict changes"),
        ("changed", "Changed, same verdict"),
        ("appeared", "New cells"),
        ("still_failing", "Still failing"),
        ("not_in_run", "Not in this run (not selected, or no longer in the matrix)"),
    )

    def sections(self) -> list[tuple[str, list[Change]]]:
        """(title, changes) for each non-empty kind, in reading order."""
        return [(title, getattr(self, name)) for name, title in self.SECTIONS if getattr(self, name)]

    @property
    def is_empty(self) -> bool:
        """No change among the cells this run has: what it did not run (still failing, not in it) is no change."""
        return not any(getattr(self, name) for name, _ in self.SECTIONS if name not in ("still_failing", "not_in_run"))


def what_changed(before: JudgedRecord, after: JudgedRecord) -> tuple[str, ...]:
    """The resolved facts (backend, KV dtype, query dtype, page size, signature) that differ, and the greedy
    output: on a deterministic engine, new tokens mean the numerics moved."""
    old, new = facts(before), facts(after)
    out = [f"{key} {old.get(key, '-')} → {new.get(key, '-')}"
           for key in dict.fromkeys([*old, *new]) if old.get(key) != new.get(key)]
    # Only like with like: a probe-only cell generates fewer tokens than a full one (the mode shows as a fact).
    same_mode = run_mode(before) == run_mode(after)
    if same_mode and before.get("tokens") and after.get("tokens") and before["tokens"] != after["tokens"]:
        out.append("greedy output tokens changed")
    return tuple(out)


def _key(record: JudgedRecord) -> tuple[str, str]:
    return record.get("gpu_class") or "?", record["cell_id"]


def diff_records(baseline: list[JudgedRecord], current: list[JudgedRecord], first_seen: dict[str, str] | None = None
                 ) -> Diff:
    """`first_seen`: fingerprint → the run it first appeared in (harness/results/history.py first_seen)."""
    old = {_key(r): r for r in baseline}
    new = {_key(r): r for r in current}
    shared = Counter(r["fingerprint"] for r in current if r.get("fingerprint"))
    out = Diff()
    for key, rec in new.items():
        prev = old.get(key)
        before = prev["verdict"] if prev else None
        fingerprint = rec.get("fingerprint")
        change = Change(*key, before, rec["verdict"], what_changed(prev, rec) if prev else (),
                        rec.get("reason", ""), bool(rec.get("flaky")), fingerprint,
                        shared[fingerprint] - 1 if fingerprint else 0,
                        (first_seen or {}).get(fingerprint) if fingerprint else None)
        failing_now, failing_before = rec["verdict"] in FAILING_VERDICTS, before in FAILING_VERDICTS
        if failing_now and not failing_before:
            out.new_failures.append(change)  # a failing new cell is a new failure too
        elif failing_now:
            out.still_failing.append(change)
        elif prev is None:
            out.appeared.append(change)
        elif failing_before:
            out.fixed.append(change)
        elif before != rec["verdict"]:
            out.verdict_changed.append(change)
        elif change.what:
            out.changed.append(change)
        else:
            out.unchanged += 1
    for key, prev in old.items():
        if key not in new:
            out.not_in_run.append(Change(*key, prev["verdict"], None, (), prev.get("reason", "")))
    out.new_failures = _grouped_by_crash(out.new_failures)
    return out


def _grouped_by_crash(changes: list[Change]) -> list[Change]:
    """Changes sharing a fingerprint next to each other, at the place of the group's first; the rest in order."""
    def group(change: Change) -> str | tuple[str, str]:
        return change.fingerprint or (change.gpu_class, change.cell_id)

    order: dict = {}
    for change in changes:
        order.setdefault(group(change), len(order))
    return sorted(changes, key=lambda change: order[group(change)])
