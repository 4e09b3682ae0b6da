"""A run's diff against its baseline as Markdown (CI logs, Buildkite annotations, the GitHub step summary), and
the short texts the HTML report shows for each change too."""

from __future__ import annotations

from dataclasses import dataclass

from kvmatrix.harness.results.diff import Change, Diff
from kvmatrix.reports.summary import same_crash_text


@dataclass(frozen=True)
class Comparison:
    """One GPU class of a run against its baseline run (None: nothing earlier to compare with)."""
    gpu_class: str
    run_id: str
    baseline: str | None
    diff: Diff

    @property
    def heading(self) -> str:
        if self.baseline is None:
            return f"{self.gpu_class}: {self.run_id} is the first run of this class, nothing to compare"
        return f"{self.gpu_class}: {self.run_id} against {self.baseline}"


def move(change: Change) -> str:
    """The verdict's move: `pass → fail`, `new: fail`, `not in this run (was pass)`."""
    text = (f"new: {change.after}" if change.before is None
            else f"not in this run (was {change.before})" if change.after is None
            else change.after if change.before == change.after
            else f"{change.before} → {change.after}")
    return text + (" (flaky)" if change.flaky else "")


def detail(change: Change) -> str:
    """What changed in the record, why it fails when it does, and where else its crash happened."""
    parts = list(change.what)
    if change.after in ("fail", "error", "xfail"):
        parts += [change.reason, same_crash_text(change.same_crash, change.first_seen)]
    return "; ".join(filter(None, parts))


def render(comparisons: list[Comparison], title: str = "What changed") -> str:
    lines = [f"## {title}", ""]
    for comp in comparisons:
        lines += [f"### {comp.heading}", ""]
        if comp.baseline is None:
            continue
        if comp.diff.is_empty:
            still, absent = len(comp.diff.still_failing), len(comp.diff.not_in_run)
            lines += [f"No changes in {comp.diff.unchanged} cells" + (f"; {still} still failing" if still else "")
                      + (f"; {absent} of the baseline's cells not in this run" if absent else "") + ".", ""]
        for section, changes in comp.diff.sections():
            lines += [f"**{section}** ({len(changes)})", ""]
            for change in changes:
                text = detail(change)
                lines.append(f"- `{change.cell_id}`: {move(change)}" + (f": {text}" if text else ""))
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"
