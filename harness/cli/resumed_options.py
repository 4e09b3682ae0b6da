"""`kvmatrix run --resume` (or an existing `--run-id`) goes on with a run as it was started: the options that
decide which cells run and how are kept in the run folder's run.json, and a resumed run takes each one its command
line leaves at the default (an option given again wins). The cases folder is kept there already."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvmatrix.harness.record.files import write_json_atomic
from kvmatrix.harness.run.guards import RUN_META, GuardError
from kvmatrix.harness.run.run_ids import resumed_run_id

# `kvmatrix run`'s options a resumed run keeps (argparse dests).
KEPT = ("gpu", "emulate", "isolation", "no_template", "cpu_ranks", "probe_only", "timeout_scale", "hub", "jobs",
        "declared_only", "refused_only", "case", "k", "cell")
DEFAULTS = "kept_defaults"  # the dest under which add_defaults leaves KEPT's defaults in the parsed arguments


def add_defaults(run: argparse.ArgumentParser) -> None:
    """Remember KEPT's defaults (after its arguments are added), to tell an option given from one left out."""
    run.set_defaults(**{DEFAULTS: {name: run.get_default(name) for name in KEPT}})


def resumed_folder(args: argparse.Namespace) -> Path | None:
    """The existing run folder this command goes on with, if any."""
    runs_dir = Path(args.runs_dir)
    if args.resume:
        try:
            return runs_dir / resumed_run_id(args.resume, runs_dir)
        except GuardError:
            return None  # plan_run says why
    return runs_dir / args.run_id if args.run_id and (runs_dir / args.run_id / RUN_META).is_file() else None


def with_kept_options(args: argparse.Namespace) -> tuple[argparse.Namespace, list[str]]:
    """`args` with the resumed run's kept options where the command line left them at the default; and the options
    taken, as `--name value` for the run's first lines."""
    folder = resumed_folder(args)
    kept = _read(folder).get("options") if folder else None
    if not isinstance(kept, dict):
        return args, []
    defaults = getattr(args, DEFAULTS, {})
    taken = {name: value for name, value in kept.items()
             if name in KEPT and getattr(args, name) == defaults.get(name) and value != defaults.get(name)}
    said = [f"--{name.replace('_', '-')}" + ("" if value is True else f" {value}") for name, value in taken.items()]
    return argparse.Namespace(**{**vars(args), **taken}), said


def keep_options(root: Path, args: argparse.Namespace) -> None:
    """Write the run's KEPT options into its run.json (beside what the run's claim wrote there)."""
    meta = _read(root)
    if meta:
        write_json_atomic(root / RUN_META, {**meta, "options": {name: getattr(args, name) for name in KEPT}})


def _read(root: Path) -> dict:
    try:
        meta = json.loads((root / RUN_META).read_bytes())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}
