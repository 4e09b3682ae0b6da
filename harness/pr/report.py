"""PR mode's answer as Markdown: one row per selected cell with its verdict at base and at head and what changed
in its record (the nightly diff's `what_changed`), cells that could not run on a side, then the nightly diff's
sections (new failures, fixed, changed with the same verdict) with head compared against base."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

from kvmatrix.harness.bisect.step import Step
from kvmatrix.harness.record.files import read_json
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.results.diff import Diff, diff_records, what_changed
from kvmatrix.reports import diff_md


@dataclass
class Side:
    """One side of the change (base or head): its commit and each selected cell's step there."""

    name: str  # base | head
    ref: str
    title: str  # short sha and subject
    steps: dict[str, Step] = field(default_factory=dict)  # cell id -> step

    def records(self) -> dict[str, JudgedRecord]:
        out = {}
        for cell_id, step in self.steps.items():
            record = read_json(Path(step.record)) if step.record else None
            if record is not None:
                out[cell_id] = record
        return out


def _cell(side: Side, cell_id: str, record: JudgedRecord | None) -> str:
    if record is not None:
        return record["verdict"]
    step = side.steps.get(cell_id)
    return f"not run: {step.reason[:120]}" if step else "not run"


def compare(base: Side, head: Side) -> tuple[Diff, str]:
    """The diff of head against base and the Markdown that shows it."""
    before, after = base.records(), head.records()
    both = [c for c in head.steps if c in before and c in after]
    diff = diff_records([before[c] for c in both], [after[c] for c in both])
    rows = []
    for cell_id in dict.fromkeys([*base.steps, *head.steps]):
        old, new = before.get(cell_id), after.get(cell_id)
        changed = "; ".join(what_changed(old, new)) if old is not None and new is not None else ""
        rows.append([f"`{cell_id}`", _cell(base, cell_id, old), _cell(head, cell_id, new), changed])
    table = tabulate(rows, headers=["cell", f"base {base.title[:40]}", f"head {head.title[:40]}", "what changed"],
                     tablefmt="github")
    gpu = next((r.get("gpu_class") for r in after.values()), None) or "this machine"
    comparison = diff_md.Comparison(gpu, f"head {head.ref[:12]}", f"base {base.ref[:12]}", diff)
    text = "\n".join([f"## Selected cells at base and head ({len(rows)})", "", table, "",
                      diff_md.render([comparison], "What the change changed")])
    return diff, text
