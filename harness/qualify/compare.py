"""Two runs side by side, cell by cell: both judged again under the current case files (in memory: a stored run
folder is read, never written), the diff of harness/results/diff.py (new failures, fixes, other verdict changes,
resolved state that moved: backend, KV dtype, page size, query dtype), and what each waiver should become now
that the new release has run: kept, removed, bounded below the new release, or widened to it."""

from __future__ import annotations

import datetime
import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.version import InvalidVersion, Version

from kvmatrix.harness.judge.fingerprint import failure_name
from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.known_failures import known_failures_for
from kvmatrix.harness.judge.outcome import reclassified
from kvmatrix.harness.judge.waivers import Waiver, waive, waiver_for
from kvmatrix.harness.qualify.registry import Check
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.neighbours import neighbours_of
from kvmatrix.harness.record.parts import FAILING_VERDICTS
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.results.diff import Diff, diff_records
from kvmatrix.matrix.conditions import matches
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.schema import GpuClass


def judged_again(folder: Path, cells: Mapping[str, Cell], pool: Mapping[str, GpuClass],
                 keep: Callable[[JudgedRecord], bool] = lambda _: True) -> list[JudgedRecord]:
    """Every kept record of a run folder judged again under the current cases, without any waiver (copies: the
    folder is left as it was); a record of a cell or class the cases no longer have, as stored."""
    run_dir, out = RunDir(folder), []
    known, today = known_failures_for(cells.values()), datetime.date.today()
    for stored in run_dir.records():
        if not keep(stored):
            continue
        cell, gpu = cells.get(stored["cell_id"]), stored.get("gpu_class", "")
        if cell is not None and gpu in pool and stored.get("status") != "skipped":
            task = Task(cell, gpu, pool[gpu], stored.get("emulated_from"))
            stored = judge_record(reclassified(stored, run_dir.log_tail(stored)), task, neighbours_of(task, run_dir),
                                  (), today, known)
        out.append(stored)
    return out


def waived(records: Sequence[JudgedRecord], waivers: Sequence[Waiver]) -> list[JudgedRecord]:
    return [waive(r, waivers)[0] for r in records]


# Facts of how a run was made, not of what vLLM did: a probe-only run against a full one, an emulated class.
RUN_FACTS = ("mode ", "emulated ")


def compare(old: Sequence[JudgedRecord], new: Sequence[JudgedRecord], waivers: Sequence[Waiver]) -> Diff:
    """The new run against the old one as CI sees them (waivers applied), cells of both runs only compared; how
    the runs were made is no change, and a known failure (xfail) that now passes counts as fixed."""
    diff = diff_records(waived(old, waivers), waived(new, waivers))
    for name, _ in diff.SECTIONS:
        setattr(diff, name, [replace(c, what=tuple(w for w in c.what if not w.startswith(RUN_FACTS)))
                             for c in getattr(diff, name)])
    diff.unchanged += sum(1 for c in diff.changed if not c.what)
    diff.changed = [c for c in diff.changed if c.what]
    known = [c for c in diff.verdict_changed if (c.before, c.after) == ("xfail", "pass")]
    diff.fixed += known
    diff.verdict_changed = [c for c in diff.verdict_changed if c not in known]
    return diff


@dataclass(frozen=True)
class WaiverAdvice:
    waiver: Waiver
    action: str  # keep | remove | bound | widen | not run | not in these runs
    line: str  # the waiver line as it should read (the same line for keep)
    why: str


def _failing(records: Sequence[JudgedRecord], waiver: Waiver) -> tuple[list[JudgedRecord], list[JudgedRecord]]:
    """(the records the waiver's cell pattern and classes match, whatever their release; those failing)."""
    matched = [r for r in records if waiver.matches(r["cell_id"], r.get("gpu_class") or "?")]
    return matched, [r for r in matched if r["verdict"] in FAILING_VERDICTS]


def advise(waiver: Waiver, old: Sequence[JudgedRecord], new: Sequence[JudgedRecord], old_ref: str,
           new_ref: str, others: Sequence[Waiver] = (), checks: Sequence[Check] = ()) -> WaiverAdvice:
    """What the waiver should become, from both runs judged without waivers; `others`: the rest of the file (a
    failure another waiver covers is that waiver's; one unlike any this waiver covered is a new failure);
    `checks`: what the findings' scripts did (a finding its script shows fixed on the new release is no reason to
    widen its waiver)."""
    old_cells, old_failing = _failing(old, waiver)
    new_cells, new_failing = _failing(new, waiver)
    ran = [r for r in new_cells if r.get("status") != "skipped" and r["verdict"] != "skip"]
    covers_new = _in_scope(waiver, new_ref)
    line = waiver_line(waiver, waiver.vllm)
    if not ran:
        return _not_run(waiver, line, old_cells, new_cells, new_ref)
    if new_failing and covers_new:
        return WaiverAdvice(waiver, "keep", line, f"{len(new_failing)} of its {len(new_cells)} cells still fail on "
                                                  f"{new_ref}")
    if not covers_new:
        return _beyond(waiver, line, old_failing, new_failing, old_ref, new_ref, others, checks)
    if old_failing and _in_scope(waiver, old_ref):
        return WaiverAdvice(waiver, "bound", waiver_line(waiver, bounded(waiver.vllm, new_ref)),
                            f"its {len(old_failing)} failing cells of {old_ref} pass on {new_ref}")
    # Removal needs cells that ran: a cell skipped on this machine (two GPUs wanted on one) says nothing of vLLM.
    return WaiverAdvice(waiver, "remove", "", f"none of its {len(ran)} cells that ran on {new_ref} fails there, "
                                              f"nor on {old_ref}")


def _not_run(waiver: Waiver, line: str, old_cells: Sequence[JudgedRecord], new_cells: Sequence[JudgedRecord],
             new_ref: str) -> WaiverAdvice:
    """No cell of the waiver ran on the new release: skipped (the machine could not run it) or absent."""
    if new_cells:
        return WaiverAdvice(waiver, "not run", line, f"its {len(new_cells)} cells were skipped on {new_ref}: "
                                                     f"{new_cells[0].get('reason') or 'not run on this machine'}")
    kind = "not run" if old_cells else "not in these runs"
    return WaiverAdvice(waiver, kind, line, f"no cell it names ran on {new_ref}")


def _beyond(waiver: Waiver, line: str, old_failing: Sequence[JudgedRecord], new_failing: Sequence[JudgedRecord],
            old_ref: str, new_ref: str, others: Sequence[Waiver], checks: Sequence[Check]) -> WaiverAdvice:
    """A waiver bounded below the new release: widened to it where the new release fails as it did, else kept."""
    if not new_failing:
        return WaiverAdvice(waiver, "keep", line, f"bounded to releases before {new_ref}; its cells pass there")
    if _shown_fixed(waiver, checks, new_ref):
        return WaiverAdvice(waiver, "keep", line, f"bounded to releases before {new_ref}; its finding's script "
                                                  f"shows it fixed there ({len(new_failing)} of its cells fail "
                                                  "for another reason)")
    everyone = list(others) if waiver in others else [waiver, *others]
    rest = [w for w in everyone if w != waiver]
    # Whose failure it is: the waiver that waived it on the old release (the first one matching there, as waiving
    # picks). Two waivers name the same cells for two findings on two release ranges (glm-fp8's load crash on 0.26,
    # its ignored KV scheme from 0.33): the new release's failure is the range before it's, the one that matched
    # on the old release, and only that one is widened, never an older range's that happens to name the cells too.
    owned = {failure_name(r) for r in old_failing if _owner(r, everyone, old_ref) == waiver}
    mine = [r for r in new_failing if waiver_for(r, rest) is None and failure_name(r) in owned]
    if mine:
        return WaiverAdvice(waiver, "widen", waiver_line(waiver, widened(waiver.vllm, new_ref)),
                            f"{len(mine)} of its cells fail on {new_ref} as on {old_ref}, a release it leaves out")
    return WaiverAdvice(waiver, "keep", line, f"bounded to releases before {new_ref}; the {len(new_failing)} of its "
                                              f"cells failing there are another waiver's or new failures")


def _owner(record: JudgedRecord, waivers: Sequence[Waiver], version: str) -> Waiver | None:
    """The waiver that waived the record on its release `version` (the first matching one)."""
    return next((w for w in waivers if w.matches(record["cell_id"], record.get("gpu_class") or "?", version)), None)


def _shown_fixed(waiver: Waiver, checks: Sequence[Check], version: str) -> bool:
    """Whether the waiver's finding's scripts ran on `version` on a class it names, every one exiting 0."""
    mine = [c for c in checks if waiver.link.endswith(f"#{c.finding}") and c.version == version
            and (not waiver.gpus or any(fnmatch.fnmatchcase(c.gpu, g) for g in waiver.gpus))]
    return bool(mine) and all(c.outcome == "good" for c in mine)


def _in_scope(waiver: Waiver, version: str) -> bool:
    return waiver.vllm is None or matches(waiver.vllm, version)


def waiver_line(waiver: Waiver, scope: str | None) -> str:
    """The waiver as a line of the waivers file, with `scope` as its vllm= (None: every release)."""
    parts = [waiver.pattern]
    if waiver.gpus:
        parts.append("gpu=" + ",".join(waiver.gpus))
    if scope:
        parts.append(f"vllm={scope}")
    parts.append(waiver.link)
    if waiver.until:
        parts.append(f"until={waiver.until.isoformat()}")
    return "  ".join(parts)


def _release(version: str) -> str:
    """`0.34.0` -> `0.34`: the bound names the minor release (a patch release is the same release line)."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return version
    return f"{parsed.major}.{parsed.minor}"


def bounded(scope: str | None, new_ref: str) -> str:
    """The scope with the new release and later ones left out: `<0.34`, `>=0.26,<0.34`."""
    below = f"<{_release(new_ref)}"
    if not scope:
        return below
    kept = [part for part in scope.split(",") if not part.startswith("<")]
    if len(kept) == 1 and kept[0].endswith(".*"):  # a glob: already below the new release, or it would cover it
        return scope
    return ",".join([*kept, below])


def widened(scope: str | None, new_ref: str) -> str | None:
    """The scope with the new release's line added: `0.33.*` -> `>=0.33,<0.35`, `<0.34` -> `<0.35`."""
    try:
        parsed = Version(new_ref)
    except InvalidVersion:
        return scope
    above = f"<{parsed.major}.{parsed.minor + 1}"
    if not scope:
        return None
    if scope.endswith(".*") and "," not in scope:
        return f">={scope.removesuffix('.*')},{above}"
    kept = [part for part in scope.split(",") if not part.startswith("<")]
    return ",".join([*kept, above]) if kept or scope.startswith("<") else f"{scope},{above}"
