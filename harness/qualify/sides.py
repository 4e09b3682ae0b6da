"""The two releases a qualification compares, and the ones between them: each end is a stored run folder (reused
as it is: a folder, or a folder inside a .tar.xz / .tar.gz archive) or an environment where the matrix runs now
(`--env REF=PATH`, as `kvmatrix bisect --env` takes it: a folder to put on PYTHONPATH, an interpreter, or a command
prefix). Environments are ordered by the version each names, oldest first; those strictly between the ends are
what a change is bisected over."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from kvmatrix.harness.bisect.given import GivenEnv
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.paths import CELL_CWD, import_root


class SideError(ValueError):
    """A side that cannot be had: no stored run and no environment, a folder without records."""


@dataclass(frozen=True)
class Side:
    role: str  # old | new
    ref: str  # the release, as the run's records or --env name it
    env: GivenEnv | None  # where its matrix (and, for the new one, the findings' scripts) can run
    run: Path | None  # its run folder: stored, or made by `run_matrix`


def version_key(ref: str) -> tuple[int, Version | str]:
    try:
        return 0, Version(ref)
    except InvalidVersion:
        return 1, ref


def stored_run(spec: str, unpack_to: Path) -> Path:
    """A run folder from `DIR` or `ARCHIVE.tar.xz:FOLDER` (the folder inside the archive: unpacked once under
    `unpack_to`)."""
    archive, sep, inner = spec.partition(".tar.")
    if sep:
        suffix, _, member = inner.partition(":")
        path = Path(f"{archive}.tar.{suffix}")
        target = unpack_to / path.name.split(".tar")[0]
        if not (target / member).is_dir():
            target.mkdir(parents=True, exist_ok=True)
            with tarfile.open(path) as opened:
                opened.extractall(target, filter="data")
        folder = target / member
    else:
        folder = Path(spec)
    if not folder.is_dir() or not RunDir(folder).records():
        raise SideError(f"{spec}: no records there (a run folder holds <class>--<cell id>.json files)")
    return folder


def stored_version(folder: Path) -> str:
    """The vLLM version the run's records name (the most common one)."""
    versions = [str(r["vllm_version"]) for r in RunDir(folder).records() if r.get("vllm_version")]
    if not versions:
        raise SideError(f"{folder}: its records name no vLLM version")
    return max(set(versions), key=versions.count)


def resolve_sides(envs: list[GivenEnv], old_run: Path | None, new_run: Path | None, old: str | None = None,
                  new: str | None = None) -> tuple[Side, Side, list[GivenEnv]]:
    """(old side, new side, the environments strictly between them, oldest first). An end without a stored run
    runs in its environment: `old` / `new` name it (default: the oldest / newest given)."""
    by_ref = {e.ref: e for e in envs}
    ordered = sorted(envs, key=lambda e: version_key(e.ref))
    ends = []
    for role, run, name, fallback in (("old", old_run, old, 0), ("new", new_run, new, -1)):
        ref = name or (stored_version(run) if run else (ordered[fallback].ref if ordered else None))
        if ref is None:
            raise SideError(f"the {role} release: give --{role}-run DIR (a stored run) or --env REF=PATH")
        if run is None and ref not in by_ref:
            raise SideError(f"the {role} release {ref}: no --env {ref}=PATH and no --{role}-run")
        ends.append(Side(role, ref, by_ref.get(ref), run))
    low, high = version_key(ends[0].ref), version_key(ends[1].ref)
    if not low < high:
        raise SideError(f"the old release {ends[0].ref} is not older than the new one {ends[1].ref}")
    between = [e for e in ordered if low < version_key(e.ref) < high]
    return ends[0], ends[1], between


def run_matrix(side: Side, runs_dir: Path, run_args: list[str]) -> Side:
    """`kvmatrix run` in the side's environment into `runs_dir/qualify-vllm<ref>` (the same command again resumes
    it); its progress goes to this terminal. Returns the side with its run folder."""
    if side.env is None or not side.env.command:
        raise SideError(f"the {side.role} release {side.ref}: no environment to run the matrix in")
    run_id = f"qualify-vllm{side.ref}"
    command = [*side.env.command, "-m", "kvmatrix", "run", "--run-id", run_id, "--runs-dir", str(runs_dir.absolute()),
               *run_args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*side.env.path_first, str(import_root())]))
    print(f"kvmatrix qualify: the {side.role} release {side.ref}: $ {' '.join(command[1:])}", flush=True)
    subprocess.run(command, env=env, cwd=CELL_CWD, stdin=subprocess.DEVNULL, check=False)  # failures are data
    folder = runs_dir / run_id
    if not folder.is_dir() or not RunDir(folder).records():
        raise SideError(f"the {side.role} release {side.ref}: `kvmatrix run` wrote no record into {folder}")
    return Side(side.role, side.ref, side.env, folder)


def here(ref: str) -> GivenEnv:
    """The environment kvmatrix runs in, as a given one named `ref`."""
    return GivenEnv(ref, sys.executable, (sys.executable,))
