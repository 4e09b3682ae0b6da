"""One bisection step: get the environment for a ref, run the cell there, call the ref good, bad or skip.

Also the test command `git bisect run` calls (`python -m harness.bisect.step PLAN.json`, in the checkout, which
git has moved to the commit to test); it follows git's contract: exit 0 good, 1 bad, 125 skip, 128 abort (a fault
of the harness itself must stop the bisection, not be counted as a bad commit).

The rule: a ref is bad when the cell's verdict is `fail` or `error` (the matrix's own verdicts: an expectation
broke or the cell could not be observed), good when it is `pass` or `xfail`, and skipped when there is nothing to
judge (no environment, a change that needs a compiled build, a cell this vLLM cannot express, a `skip` verdict).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.bisect.envs import EnvBuildError, compiled_changes, package_dir, release_env, sync_overlay, wheel_env
from harness.paths import REPO_ROOT
from harness.records import read_json

OUTCOME = {"pass": "good", "xfail": "good", "fail": "bad", "error": "bad", "skip": "skip"}
EXIT_CODE = {"good": 0, "bad": 1, "skip": 125}
ABORT = 128


@dataclass
class Plan:
    """What every step of one bisection shares; saved as JSON for the steps `git bisect run` starts."""

    cell: str
    folder: str
    cache_dir: str
    package: str
    mode: str  # release | wheel | overlay
    wheel_index: str | None = None
    base_version: str | None = None  # overlay: the installed release the checkout's Python is laid over
    base_ref: str | None = None  # overlay: the commit of that release (diffs from it decide compiled changes)
    checkout: str | None = None
    overlay: str | None = None  # overlay: where the laid-over package goes (default <folder>/overlay), shareable

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
    cell_s: float = 0.0
    label: str = ""  # why this ref ran: good end, bad end, bisect, last good

    def line(self) -> str:
        verdict = f"{self.verdict} -> " if self.verdict else ""
        note = "" if self.outcome != "skip" else f"  ({self.reason[:300]})"
        return (f"{self.ref[:12]:<12} {self.label:<9} env {self.env_s:6.1f} s  cell {self.cell_s:6.1f} s  "
                f"{verdict}{self.outcome}{note}")


def steps_file(plan: Plan) -> Path:
    return Path(plan.folder) / "steps.jsonl"


def recorded_steps(plan: Plan) -> dict[str, Step]:
    path = steps_file(plan)
    if not path.exists():
        return {}
    steps = (Step(**json.loads(line)) for line in path.read_text().splitlines() if line.strip())
    return {s.ref: s for s in steps}


def step_environment(plan: Plan, ref: str) -> tuple[Path, list[str]]:
    """The python that runs `ref`'s cell and what goes first on its PYTHONPATH."""
    cache = Path(plan.cache_dir)
    if plan.mode == "release":
        return release_env(plan.package, ref, cache), []
    if plan.mode == "wheel":
        return wheel_env(plan.package, ref, plan.wheel_index, cache), []
    changed = compiled_changes(Path(plan.checkout), plan.base_ref, ref)
    if changed:
        raise EnvBuildError(f"changes compiled code, needs its own build: {', '.join(changed[:5])}")
    python = release_env(plan.package, plan.base_version, cache)
    overlay = Path(plan.overlay or Path(plan.folder) / "overlay")
    sync_overlay(Path(plan.checkout) / "vllm", package_dir(python), overlay / "vllm")
    return python, [str(overlay)]


def run_step(plan: Plan, ref: str, label: str = "") -> Step:
    """Run the cell at `ref` (once per bisection: a ref already run is answered from steps.jsonl)."""
    done = recorded_steps(plan).get(ref)
    if done is not None:
        return done
    run_id = ref if plan.mode == "release" else ref[:12]
    started = time.monotonic()
    try:
        python, path_first = step_environment(plan, ref)
    except EnvBuildError as err:
        return _save(plan, Step(ref, "skip", reason=f"no environment: {err}", label=label,
                                env_s=time.monotonic() - started))
    env_s = time.monotonic() - started
    steps_dir = Path(plan.folder) / "steps"
    steps_dir.mkdir(parents=True, exist_ok=True)
    out = steps_dir / f"{run_id}.outcome.json"
    out.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path_first, str(REPO_ROOT)]))
    with (steps_dir / f"{run_id}.log").open("wb") as log:
        subprocess.run([str(python), "-m", "harness.bisect.cell", plan.cell, str(steps_dir), run_id,
                        plan.cache_dir, str(out)], env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL)
    step = Step(ref, "skip", label=label, env_s=env_s, cell_s=time.monotonic() - started - env_s)
    try:
        answer = json.loads(out.read_text())
    except (OSError, ValueError):
        step.reason = f"the step's harness did not finish; see {steps_dir / f'{run_id}.log'}"
        return _save(plan, step)
    record = read_json(Path(answer["record"])) if "record" in answer else None
    if record is None:
        step.reason = answer.get("skip", "no record")
        return _save(plan, step)
    step.outcome, step.verdict, step.reason = OUTCOME[record["verdict"]], record["verdict"], record.get("reason", "")
    step.record = answer["record"]
    return _save(plan, step)


def _save(plan: Plan, step: Step) -> Step:
    with steps_file(plan).open("a") as f:
        f.write(json.dumps(asdict(step)) + "\n")
    line = step.line()
    with (Path(plan.folder) / "bisect.log").open("a") as log:
        log.write(line + "\n")
    print(line, flush=True)
    return step


def main(argv: list[str]) -> int:
    try:
        plan = Plan.load(Path(argv[0]))
        ref = subprocess.run(["git", "-C", plan.checkout, "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        return EXIT_CODE[run_step(plan, ref, label="bisect").outcome]
    except Exception:  # noqa: BLE001 - any fault of ours aborts the bisection rather than marking a commit bad
        traceback.print_exc()
        return ABORT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
