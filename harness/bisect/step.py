"""One bisection step: get the environment for a ref, run the cells there, call the ref good, bad or skip for
each cell. The cells of one step run in one harness in that environment: with warm workers (the default for
several cells), one worker imports vLLM once and runs them one after another.

Also the test command `git bisect run` calls (`python -m kvmatrix.harness.bisect.step PLAN.json`, in the checkout, which
git has moved to the commit to test); it follows git's contract: exit 0 good, 1 bad, 125 skip, 128 abort (a fault
of the harness itself must stop the bisection, not be counted as a bad commit).

The rule: a ref is bad when the cell's verdict is `fail` or `error` (the matrix's own verdicts: an expectation
broke or the cell could not be observed), good when it is `pass` or `xfail`, and skipped when there is nothing to
judge (no environment, a change that needs a compiled build, a cell this vLLM cannot express, a `skip` verdict, a
failure of the environment itself such as a missing compiled library).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvmatrix.harness.bisect.envs import (
    EnvBuildError,
    compiled_changes,
    package_dir,
    release_env,
    sync_overlay,
    wheel_env,
)
from kvmatrix.harness.bisect.given import GivenEnv, check
from kvmatrix.harness.record.files import read_json
from kvmatrix.harness.record.paths import CELL_CWD, import_root
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.vllm_compat import ENVIRONMENT_SIGNATURES

OUTCOME = {"pass": "good", "xfail": "good", "fail": "bad", "error": "bad", "skip": "skip"}
EXIT_CODE = {"good": 0, "bad": 1, "skip": 125}
ABORT = 128


@dataclass
class Plan:
    """What every step of one bisection shares; saved as JSON for the steps `git bisect run` starts."""

    cells: list[str]
    folder: str
    cache_dir: str
    package: str
    mode: str  # release | wheel | overlay | given
    wheel_index: str | None = None
    base_version: str | None = None  # overlay: the installed release the checkout's Python is laid over
    base_ref: str | None = None  # overlay: the commit of that release (diffs from it decide compiled changes)
    checkout: str | None = None
    overlay: str | None = None  # overlay: where the laid-over package goes (default <folder>/overlay), shareable
    envs: dict[str, dict] = field(default_factory=dict)  # given: ref -> GivenEnv.as_json()
    gpu: str | None = None  # the class to run as (emulated when it is not this machine's)
    isolation: str | None = None  # worker | process; default: warm workers when a step runs several cells

    @property
    def cell(self) -> str:  # git bisect runs one cell
        return self.cells[0]

    def save(self) -> Path:
        path = Path(self.folder) / "plan.json"
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def load(cls, path: Path) -> Plan:
        return cls(**json.loads(Path(path).read_text()))


@dataclass
class Step:
    ref: str
    outcome: str  # good | bad | skip
    verdict: str | None = None
    reason: str = ""
    record: str | None = None
    env_s: float = 0.0
    cell_s: float = 0.0  # the cell's own run (its record's total), inside the step
    step_s: float = 0.0  # the whole step in that environment: harness start, imports, every cell of the step
    label: str = ""  # why this ref ran: good end, bad end, bisect, last good
    cell: str = ""
    shared_with: int = 0  # other cells run in the same step (one harness, one warm worker)

    def line(self) -> str:
        verdict = f"{self.verdict} -> " if self.verdict else ""
        note = "" if self.outcome != "skip" else f"  ({self.reason[:300]})"
        shared = f" with {self.shared_with} more cell(s)" if self.shared_with else ""
        return (f"{self.ref[:12]:<12} {self.label:<9} env {self.env_s:6.1f} s  step {self.step_s:6.1f} s{shared}  "
                f"cell {self.cell_s:6.1f} s  {verdict}{self.outcome}{note}")


def steps_file(plan: Plan) -> Path:
    return Path(plan.folder) / "steps.jsonl"


def recorded_steps(plan: Plan, cell: str | None = None) -> dict[str, Step]:
    """The steps already run for `cell` (default: the plan's first), by ref."""
    path, cell = steps_file(plan), cell or plan.cell
    if not path.exists():
        return {}
    steps = (Step(**json.loads(line)) for line in path.read_text().splitlines() if line.strip())
    return {s.ref: s for s in steps if s.cell == cell}


def step_environment(plan: Plan, ref: str) -> tuple[list[str], list[str]]:
    """The command (an interpreter, or a prefix ending in one) that runs `ref`'s cells, and what goes first on
    its PYTHONPATH."""
    cache = Path(plan.cache_dir)
    if plan.mode == "given":
        env = GivenEnv.from_json(plan.envs[ref])
        check(env)
        return list(env.command), list(env.path_first)
    if plan.mode == "release":
        return [str(release_env(plan.package, ref, cache))], []
    if plan.mode == "wheel":
        return [str(wheel_env(plan.package, ref, planned(plan.wheel_index, "wheel index"), cache))], []
    checkout = Path(planned(plan.checkout, "checkout"))
    changed = compiled_changes(checkout, planned(plan.base_ref, "base commit"), ref)
    if changed:
        raise EnvBuildError(f"changes compiled code, needs its own build: {', '.join(changed[:5])}")
    # None where no vLLM is installed here and no --base-version was given: then no step has an environment.
    python = release_env(plan.package, planned(plan.base_version, "base release"), cache)
    overlay = Path(plan.overlay or Path(plan.folder) / "overlay")
    sync_overlay(checkout / "vllm", package_dir(python), overlay / "vllm")
    return [str(python)], [str(overlay)]


def planned(value: str | None, what: str) -> str:
    """A plan field its mode needs (`bisect` sets it for that mode); without it, a step has no environment."""
    if value is None:
        raise EnvBuildError(f"the bisection's plan has no {what}")
    return value


def run_step(plan: Plan, ref: str, label: str = "") -> Step:
    """The plan's first cell at `ref` (git bisect's one cell)."""
    return run_steps(plan, ref, [plan.cell], label)[plan.cell]


def run_steps(plan: Plan, ref: str, cells: list[str], label: str = "") -> dict[str, Step]:
    """Run `cells` at `ref`, together in one harness (a cell already run at this ref in this bisection is
    answered from steps.jsonl)."""
    done = {c: s for c in cells if (s := recorded_steps(plan, c).get(ref)) is not None}
    todo = [c for c in cells if c not in done]
    if not todo:
        return done
    run_id = ref if plan.mode in ("release", "given") else ref[:12]
    started = time.monotonic()
    try:
        command, path_first = step_environment(plan, ref)
    except EnvBuildError as err:
        env_s = time.monotonic() - started
        return done | {c: _save(plan, Step(ref, "skip", reason=f"no environment: {err}", label=label, env_s=env_s,
                                           cell=c)) for c in todo}
    env_s = time.monotonic() - started
    steps_dir = Path(plan.folder) / "steps"
    steps_dir.mkdir(parents=True, exist_ok=True)
    out = steps_dir / f"{run_id}.outcome.json"
    out.unlink(missing_ok=True)
    request = steps_dir / f"{run_id}.request.json"
    isolation = plan.isolation or ("worker" if len(todo) > 1 else "process")
    request.write_text(json.dumps({"cells": todo, "runs_dir": str(steps_dir), "run_id": run_id,
                                   "cache_dir": plan.cache_dir, "out": str(out), "gpu": plan.gpu,
                                   "isolation": isolation}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path_first, str(import_root())]))
    with (steps_dir / f"{run_id}.log").open("ab") as log:
        subprocess.run([*command, "-m", "kvmatrix.harness.bisect.cell", str(request)], env=env, cwd=CELL_CWD,
                       stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    step_s = time.monotonic() - started - env_s
    try:
        answer = json.loads(out.read_text())
    except (OSError, ValueError):
        answer = {}
    steps = {}
    for cell in todo:
        step = Step(ref, "skip", label=label, env_s=env_s, step_s=step_s, cell=cell, shared_with=len(todo) - 1)
        record = read_json(Path(answer["records"][cell])) if cell in answer.get("records", {}) else None
        if not answer:
            step.reason = f"the step's harness did not finish; see {steps_dir / f'{run_id}.log'}"
        elif record is None:
            step.reason = answer.get("skips", {}).get(cell, "no record")
        else:
            step.outcome, step.verdict, step.reason = judge_step(record)
            step.record = answer["records"][cell]
            step.cell_s = float((record.get("timings") or {}).get("total_s") or 0.0)
        steps[cell] = _save(plan, step)
    return done | steps


def judge_step(record: JudgedRecord) -> tuple[str, str, str]:
    """(good / bad / skip, the record's verdict, why) for a step's record: a failure of the environment itself
    (a compiled library missing from the install, a module not installed) is nothing to judge."""
    reason = record.get("reason", "")
    if record.get("signature") in ENVIRONMENT_SIGNATURES:
        return "skip", record["verdict"], f"the environment is incomplete ({record['signature']}): {reason}"
    return OUTCOME[record["verdict"]], record["verdict"], reason


def _save(plan: Plan, step: Step) -> Step:
    with steps_file(plan).open("a") as f:
        f.write(json.dumps(asdict(step)) + "\n")
    line = (f"{step.cell}  " if len(plan.cells) > 1 else "") + step.line()
    with (Path(plan.folder) / "bisect.log").open("a") as log:
        log.write(line + "\n")
    print(line, flush=True)
    return step


def main(argv: list[str]) -> int:
    try:
        plan = Plan.load(Path(argv[0]))
        ref = subprocess.run(["git", "-C", planned(plan.checkout, "checkout"), "rev-parse", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        return EXIT_CODE[run_step(plan, ref, label="bisect").outcome]
    except Exception:  # noqa: BLE001 - any fault of ours aborts the bisection rather than marking a commit bad
        traceback.print_exc()
        return ABORT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
