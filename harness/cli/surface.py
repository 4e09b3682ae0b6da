"""`kvmatrix surface`: what the installed vLLM declares each attention backend supports, per GPU class. Reading,
the table, the diff of two environments and the broken promises are harness/surface/report.py's; here its
arguments, what it prints and writes, and its exit status."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvmatrix.harness.bisect.envs import EnvBuildError
from kvmatrix.harness.bisect.given import parse_env_args
from kvmatrix.harness.cli.exit_codes import OK, USAGE
from kvmatrix.harness.surface.cases import write_cases
from kvmatrix.harness.surface.report import diff_lines, promises_report, read_surface, render, surface_in
from kvmatrix.matrix.machine import PoolError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", action="append", help="a class of the pool (repeat it; default: every class)")
    p.add_argument("--json", help="also write every point of the surface, with vLLM's reasons, to this file")
    p.add_argument("--from-json", metavar="FILE", help="a surface read elsewhere (its --json) instead of this "
                                                       "install's")
    p.add_argument("--write-cases", metavar="DIR", help="write one case file per backend holding vLLM to its "
                                                        "declaration (e.g. cases/surface)")
    p.add_argument("--promises", nargs="+", metavar="RUN_DIR",
                   help="count the broken promises that runs of the generated cases found, per class")
    p.add_argument("--cases-dir", default="cases/surface", help="with --promises: the generated cases")
    p.add_argument("--diff", nargs=2, metavar="REF=PATH",
                   help="compare two vLLM environments' surfaces (a folder, an interpreter or a command prefix)")
    p.set_defaults(func=cmd_surface)


def cmd_surface(args: argparse.Namespace) -> int:
    try:
        if args.promises:
            print(promises_report(args.promises, Path(args.cases_dir)))
            return OK
        if args.diff:
            old, new = parse_env_args(args.diff)
            print("\n".join(diff_lines(surface_in(old), surface_in(new), old.ref, new.ref)))
            return OK
        # --from-json: read on another machine, e.g. cases for a GPU pool written on the CPU
        surface = read_surface(args.gpu, Path(args.from_json) if args.from_json else None)
    except (ValueError, OSError, EnvBuildError, PoolError) as err:
        print(f"kvmatrix surface: {err}", file=sys.stderr)
        return USAGE
    if args.json:
        Path(args.json).write_text(json.dumps(surface.as_json(), indent=1) + "\n")
    if args.write_cases:
        written = write_cases(surface, Path(args.write_cases))
        print(f"wrote {len(written)} case files to {args.write_cases} (run them: kvmatrix run --cases-dir "
              f"{args.write_cases})")
    print(render(surface))
    return OK
