"""What a vLLM change touches, run before and after, and what it changed: the work behind `kvmatrix pr` (its
arguments are harness/cli/pr.py's).

The change is BASE..HEAD of a vLLM checkout (`--repo DIR --base REF --head REF`), or a patch applied on BASE
(`--patch FILE`). The files it names select cells from a run's records (`--records RUN_DIR`, e.g. the last nightly
run; harness/pr/select.py says how, and every selected cell is printed with why). Each selected cell then runs
at BASE and at HEAD through bisection's steps (harness/bisect/step.py): the checkout's Python laid over the
installed vLLM build, in a worktree of the checkout (the checkout itself is left alone). So the change must be
Python only: one touching compiled code (csrc/, *.cu, *.cpp, CMakeLists.txt, ...) is refused. The answer is
the nightly diff of HEAD against BASE (harness/pr/report.py), with the cells that fail at HEAD and did not at BASE.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvmatrix.harness.bisect.envs import is_compiled
from kvmatrix.harness.bisect.step import Plan, run_steps
from kvmatrix.harness.pr.report import Side, compare
from kvmatrix.harness.pr.select import Selection, load_records, select
from kvmatrix.harness.record.paths import DEFAULT_CACHE
from kvmatrix.harness.results import history
from kvmatrix.harness.vllm_compat import installed_vllm_distribution

GIT_IDENTITY = ["-c", "user.name=kvmatrix", "-c", "user.email=kvmatrix@localhost", "-c", "commit.gpgsign=false"]


class PrError(RuntimeError):
    pass


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *GIT_IDENTITY, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise PrError(f"git {' '.join(args[:3])}: {done.stderr.strip()}")
    return done.stdout.strip()


def changed_files(repo: Path, base: str, head: str) -> list[str]:
    return _git(repo, "diff", "--name-only", base, head).splitlines()


def refuse_compiled(files: list[str]) -> None:
    compiled = [f for f in files if is_compiled(f)]
    if compiled:
        raise PrError(f"the change touches compiled code ({', '.join(compiled[:8])}"
                      f"{', ...' if len(compiled) > 8 else ''}): PR mode lays the checkout's Python over the "
                      "installed vLLM build, so only Python changes can run; build the change (or use per-commit "
                      "wheels with `kvmatrix bisect --wheel-index`) instead")


def selection_for(repo: Path, base: str, head: str, records_dir: Path) -> tuple[list[str], Selection]:
    """The changed files (refused if compiled code is among them) and the cells they select."""
    files = changed_files(repo, base, head)
    refuse_compiled(files)
    records = records_from(records_dir)
    if not records:
        raise PrError(f"no records in {records_dir}: give a run folder (e.g. the last nightly run)")
    return files, select(files, records)


def records_from(source: Path) -> list[dict]:
    """A run folder's records, or a history database's latest run (every GPU class of it)."""
    if Path(source).is_file():
        db = history.open_db(source)
        run_id = history.latest_run(db)
        return [dict(r) for r in history.records_of(db, run_id)] if run_id else []
    return load_records(source)


def _worktree(repo: Path, checkout: Path, base: str, patch: Path | None) -> str:
    """A detached worktree of `repo` at base; with a patch, the patch committed on it. Returns HEAD's sha."""
    shutil.rmtree(checkout, ignore_errors=True)
    _git(repo, "worktree", "prune")
    _git(repo, "worktree", "add", "--detach", str(checkout), base)
    if patch is not None:
        _git(checkout, "apply", "--index", str(Path(patch).resolve()))
        _git(checkout, "commit", "-q", "-m", f"kvmatrix pr: {Path(patch).name} on {base[:12]}")
    return _git(checkout, "rev-parse", "HEAD")


def run_side(side: Side, cells: list[str], checkout: Path, folder: Path, base_ref: str, cache_dir: Path) -> None:
    """Every selected cell at one side's commit: one bisection step (one shared overlay; the cells share a warm
    worker when there are several)."""
    _git(checkout, "checkout", "-q", "--detach", side.ref)
    package, version = installed_vllm_distribution()
    plan = Plan(cells, str(folder / "cells"), str(cache_dir.resolve()), package, "overlay", base_version=version,
                base_ref=base_ref, checkout=str(checkout), overlay=str(folder / "overlay"))
    Path(plan.folder).mkdir(parents=True, exist_ok=True)
    side.steps.update(run_steps(plan, side.ref, cells, label=side.name))


@dataclass(frozen=True)
class PrOutcome:
    """What `run_pr` found: the diff of HEAD against BASE as Markdown (empty when nothing ran), and whether a cell
    fails at HEAD that did not at BASE."""

    report: str = ""
    new_failures: bool = False


def run_pr(repo: Path, base: str, head: str | None, patch: Path | None, records_dir: Path, folder: Path,
           on_selection: Callable[[str], None], base_ref: str | None = None, cache_dir: Path = DEFAULT_CACHE,
           select_only: bool = False) -> PrOutcome:
    """The change's cells at BASE and HEAD, in `folder` (selection.txt, the steps, result.md). `on_selection` gets
    the selection and why each cell is in it, before any cell runs."""
    repo, folder = repo.resolve(), folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    base_sha = _git(repo, "rev-parse", f"{base}^{{commit}}")
    checkout = folder / "checkout"
    try:
        head_sha = (_worktree(repo, checkout, base_sha, patch) if patch
                    else _git(repo, "rev-parse", f"{head}^{{commit}}"))
        files, selection = selection_for(checkout if patch else repo, base_sha, head_sha, records_dir)
        text = "\n".join(selection.lines())
        on_selection(text)
        (folder / "selection.txt").write_text(text + "\n")
        if select_only or not selection.cells:
            return PrOutcome()
        if not patch:
            _worktree(repo, checkout, base_sha, None)
        sides = [Side(name, sha, _git(checkout, "log", "-1", "--format=%h %s", sha))
                 for name, sha in (("base", base_sha), ("head", head_sha))]
        for side in sides:
            run_side(side, list(selection.cells), checkout, folder, base_ref or base_sha, cache_dir)
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(checkout)], capture_output=True)
    diff, report = compare(*sides)
    (folder / "result.md").write_text(report)
    return PrOutcome(report, bool(diff.new_failures))
