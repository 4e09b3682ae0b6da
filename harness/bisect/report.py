"""A bisection's answer as text: the first bad and last good refs, their two records side by side (rows that
differ are marked), and every step with its time."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

from kvmatrix.harness.bisect.step import Step
from kvmatrix.harness.judge.facts import facts
from kvmatrix.harness.record.files import read_json
from kvmatrix.harness.record.types import JudgedRecord


@dataclass
class Result:
    cell: str
    good: str
    bad: str
    target: str  # what was bisected, in words
    conclusion: str  # one sentence
    # Where the verdict changed: the first ref that behaves as the newest end, the last that behaves as the oldest.
    # For a regression those are the first bad and the last good; for a fix (`fixed`), the first good and last bad.
    first_bad: str | None = None
    last_good: str | None = None
    fixed: bool = False
    candidates: list[str] = field(default_factory=list)  # when skipped refs leave several possible first bad
    steps: list[Step] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # ref -> how to show it (short sha + subject)

    @property
    def found(self) -> bool:
        return self.first_bad is not None and not self.candidates

    def step(self, ref: str | None) -> Step | None:
        return next((s for s in self.steps if s.ref == ref), None)


def _record_rows(record: JudgedRecord | None) -> dict[str, str]:
    if record is None:
        return {}
    layers = record.get("layers") or []
    rows = {"verdict": record["verdict"], "reason": (record.get("reason") or "")[:80],
            "vllm": record.get("vllm_version") or ""}
    rows.update(facts(record))
    rows["layer kv"] = " ".join(str(la.get("kv_cache_dtype")) for la in layers)
    rows["layer spec"] = " ".join(str(la.get("spec_dtype")) for la in layers)
    return rows


def side_by_side(left_title: str, left: JudgedRecord | None, right_title: str, right: JudgedRecord | None) -> str:
    a, b = _record_rows(left), _record_rows(right)
    rows = [[key, a.get(key, ""), b.get(key, ""), "" if a.get(key) == b.get(key) else "<- differs"]
            for key in dict.fromkeys([*a, *b])]
    return tabulate(rows, headers=["", left_title, right_title, ""], tablefmt="github")


def render(result: Result) -> str:
    name = lambda ref: result.names.get(ref, ref)  # noqa: E731
    lines = [f"kvmatrix bisect: {result.cell}, {result.target}, from {name(result.good)} to {name(result.bad)}",
             "", result.conclusion]
    roles = ("last bad", "first good") if result.fixed else ("last good", "first bad")
    if result.candidates:
        lines += [f"{roles[1]} is one of (skipped refs hide which):", *(f"  {name(r)}" for r in result.candidates)]
    elif result.first_bad:
        lines += [f"{roles[1]}: {name(result.first_bad)}", f"{roles[0]}: {name(result.last_good)}"]
    if result.first_bad:
        left, right = result.last_good, result.first_bad
    else:
        (left, right), roles = (result.good, result.bad), ("given good", "given bad")
    records = [read_json(Path(s.record)) if (s := result.step(ref)) and s.record else None for ref in (left, right)]
    titles = [f"{role} {str(name(ref))[:40]}" for role, ref in zip(roles, (left, right), strict=True)]
    lines += ["", side_by_side(titles[0], records[0], titles[1], records[1])]
    total = sum(s.env_s + (s.step_s or s.cell_s) for s in result.steps)
    bisecting = sum(s.label == "bisect" for s in result.steps)
    shared = " (steps shared with other cells counted whole)" if any(s.shared_with for s in result.steps) else ""
    lines += ["", f"{len(result.steps)} steps ({bisecting} by bisection), {total:.0f} s{shared}:",
              *(f"  {s.line()}" for s in result.steps)]
    return "\n".join(lines)
