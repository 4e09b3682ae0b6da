"""A qualification as data: both runs compared, each verdict change placed among the releases between, every
finding's script on the new release against what was known of the old one, every waiver's advice, and the exit
status CI reads. `as_data` gives the JSON that reports/qualification.py renders as Markdown and HTML."""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvmatrix.harness.bisect.report import Result
from kvmatrix.harness.qualify.bisection import Key, where
from kvmatrix.harness.qualify.compare import WaiverAdvice
from kvmatrix.harness.qualify.registry import Check, Finding, seen_on
from kvmatrix.harness.qualify.sides import Side
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.results.diff import Change, Diff
from kvmatrix.reports.diff_md import detail, move

# The diff's kinds, as the report lists them: verdict changes first (each bisected), then state. A new `error` is
# listed apart from a new `fail`: the cell could not be observed (the environment, the harness), vLLM is not judged.
SECTIONS = (("new_failures", "New failures"), ("new_errors", "New errors: cells the new run could not observe"),
            ("fixed", "Fixed"), ("verdict_changed", "Other verdict changes"),
            ("changed", "Resolved state changed, same verdict"))
BISECTED = ("new_failures", "fixed", "verdict_changed")


@dataclass
class Qualification:
    old: Side
    new: Side
    between: list[str]
    old_records: list[JudgedRecord]
    new_records: list[JudgedRecord]
    diff: Diff
    bisections: Mapping[Key, Result] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)  # the scripts run on the new release now
    known: list[Check] = field(default_factory=list)  # the status file before
    waivers: list[WaiverAdvice] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)

    def bisected_changes(self) -> list[Change]:
        return [c for name in BISECTED for c in getattr(self.diff, name)]

    def finding_rows(self) -> list[dict[str, Any]]:
        """Each finding whose scripts ran now: what was known on the old release, what they did on the new one."""
        rows = []
        for finding in self.findings:
            mine = [c for c in self.checks if c.finding == finding.id]
            if not mine:
                continue
            package = mine[0].package
            before = seen_on(finding, self.known, package).get(self.old.ref, "not run")
            outcomes = {c.outcome for c in mine}
            now = "bad" if "bad" in outcomes else "good" if outcomes == {"good"} else "no verdict"
            rows.append({"finding": finding.id, "bug": finding.bug, "old": before, "new": now,
                         "movement": movement(before, now),
                         "scripts": [{"gpu": c.gpu, "exit": c.exit, "seconds": c.seconds, "lines": c.lines,
                                      "said": c.said} for c in mine]})
        return rows

    def section(self, name: str) -> list[Change]:
        if name in ("new_failures", "new_errors"):
            wanted = "error" if name == "new_errors" else "fail"
            return [c for c in self.diff.new_failures if (c.after == "error") == (wanted == "error")]
        return list(getattr(self.diff, name))

    def failing_reasons(self) -> list[str]:
        """Why CI should fail: cells that fail (or cannot be observed) now and did not, findings that were right
        and show again."""
        out = [f"{len(self.section(n))} {n.replace('_', ' ')[:-1]}(s)" for n in ("new_failures", "new_errors")
               if self.section(n)]
        back = [r["finding"] for r in self.finding_rows() if r["movement"] == "back"]
        return out + ([f"finding(s) back on {self.new.ref}: {', '.join(back)}"] if back else [])

    def as_data(self) -> dict[str, Any]:
        return {
            "title": f"vLLM {self.new.ref} against {self.old.ref}",
            "made": datetime.date.today().isoformat(),
            "old": _side(self.old), "new": _side(self.new), "between": self.between,
            "classes": sorted({r.get("gpu_class") or "?" for r in self.new_records}),
            "counts": {"old": _counts(self.old_records), "new": _counts(self.new_records)},
            "compared": sum(len(getattr(self.diff, n)) for n, _ in self.diff.SECTIONS
                            if n not in ("appeared", "not_in_run")) + self.diff.unchanged,
            "unchanged": self.diff.unchanged, "still_failing": len(self.diff.still_failing),
            "appeared": [_change(c) for c in self.diff.appeared],
            "not_in_run": len(self.diff.not_in_run),
            "sections": [{"name": name, "title": title, "changes": [self._row(c) for c in self.section(name)]}
                         for name, title in SECTIONS],
            "findings": self.finding_rows(),
            "waivers": [{"where": a.waiver.where, "pattern": a.waiver.pattern, "action": a.action, "line": a.line,
                         "why": a.why} for a in self.waivers],
            "fails": self.failing_reasons(),
            "commands": self.commands,
        }

    def _row(self, change: Change) -> dict[str, Any]:
        """A change, and where it happened where it was bisected."""
        row = _change(change)
        result = self.bisections.get((change.gpu_class, change.cell_id))
        if result is not None:
            row["where"] = where(result, self.old, self.new)
        return row


def movement(before: str, now: str) -> str:
    """What happened to a finding from the old release to the new one."""
    return {("bad", "good"): "fixed", ("bad", "bad"): "still there", ("good", "bad"): "back",
            ("good", "good"): "still right", ("not run", "bad"): "shows", ("not run", "good"): "right"}.get(
        (before, now), "no verdict" if now == "no verdict" else f"{before} → {now}")


def _side(side: Side) -> dict[str, Any]:
    return {"ref": side.ref, "run": str(side.run) if side.run else None,
            "env": side.env.spec if side.env else None}


def _counts(records: Sequence[JudgedRecord]) -> dict[str, int]:
    return dict(Counter(r["verdict"] for r in records))


def _change(change: Change) -> dict[str, Any]:
    return {"gpu": change.gpu_class, "cell": change.cell_id, "before": change.before, "after": change.after,
            "move": move(change), "detail": detail(change)}
