"""Where among the releases between the two ends each verdict change happened: `kvmatrix bisect`'s search over
given environments (harness/bisect/search.py bisect_ordered), with both ends answered from the two runs' records
(written into the bisection's steps as if run), so that only releases in between run, the cells of one class
together in each."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from kvmatrix.harness.bisect.given import GivenEnv
from kvmatrix.harness.bisect.report import Result
from kvmatrix.harness.bisect.search import bisect_ordered
from kvmatrix.harness.bisect.step import Plan, Step, judge_step, steps_file
from kvmatrix.harness.qualify.sides import Side
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.results.diff import Change

Key = tuple[str, str]  # (GPU class, cell id)


def _end_env(side: Side) -> GivenEnv:
    """An end's environment; a stored run without one gets a placeholder no step ever runs (its steps are seeded)."""
    return side.env or GivenEnv(side.ref, f"stored run {side.run}")


def _seed(plan: Plan, side: Side, label: str, records: dict[Key, JudgedRecord], gpu: str) -> None:
    """The end's steps from its records, judged as a bisection step judges (waivers left out)."""
    assert side.run is not None
    with steps_file(plan).open("a") as out:
        for cell in plan.cells:
            record = records[(gpu, cell)]
            outcome, verdict, reason = judge_step(record)
            path = RunDir(side.run).record_path(cell, gpu)
            step = Step(side.ref, outcome, verdict, reason, str(path), label=f"{label} (its run)", cell=cell)
            out.write(json.dumps(asdict(step)) + "\n")


def bisect_changes(changes: list[Change], old: Side, new: Side, between: list[GivenEnv],
                   old_records: dict[Key, JudgedRecord], new_records: dict[Key, JudgedRecord], folder: Path,
                   cache_dir: Path) -> dict[Key, Result]:
    """Each verdict change of a cell both runs hold, bisected over `between`; none without releases between."""
    wanted = [c for c in changes if (c.gpu_class, c.cell_id) in old_records and (c.gpu_class, c.cell_id) in new_records]
    if not between or not wanted:
        return {}
    out: dict[Key, Result] = {}
    for gpu in dict.fromkeys(c.gpu_class for c in wanted):
        cells = list(dict.fromkeys(c.cell_id for c in wanted if c.gpu_class == gpu))
        envs = [_end_env(old), *between, _end_env(new)]
        plan = Plan(cells=cells, folder=str((folder / f"bisect-{gpu}").resolve()), cache_dir=str(cache_dir.resolve()),
                    package="vllm", mode="given", envs={e.ref: e.as_json() for e in envs}, gpu=gpu)
        Path(plan.folder).mkdir(parents=True, exist_ok=True)
        steps_file(plan).unlink(missing_ok=True)  # the ends are seeded afresh from this comparison's records
        plan.save()
        _seed(plan, old, "oldest", old_records, gpu)
        _seed(plan, new, "newest", new_records, gpu)
        target = "releases " + ", ".join(e.ref for e in envs)
        out |= {(gpu, r.cell): r for r in bisect_ordered(plan, [e.ref for e in envs], target)}
    return out


def where(result: Result, old: Side, new: Side) -> str:
    """Where the change happened among the releases from `old` to `new`, in words."""
    if result.first_bad is None:
        return result.conclusion
    change = "first good" if result.fixed else "first bad"
    return f"{change} {result.first_bad} (last {'bad' if result.fixed else 'good'} {result.last_good}), bisected"
