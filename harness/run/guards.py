"""Refusals before a run starts, so that a run never mixes what it should not: records judged under other case
files in one results folder, or a results folder on a disk about to fill up mid-run (a torn night)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from kvmatrix.harness.judge.waivers import WAIVERS_FILE
from kvmatrix.harness.record.files import write_json_atomic
from kvmatrix.matrix.load import CASES_DIR, MODELS_FILE, POOL_FILE, shared_file

RUN_META = "run.json"


class GuardError(RuntimeError):
    pass


def cases_fingerprint(cases_dir: Path) -> str:
    """One hash over every file the verdicts depend on: the folder's cases, shared blocks, registry, pool and
    waivers, and the default case set's registry, pool and waivers where the folder borrows them."""
    folder = Path(cases_dir)
    borrowed = [shared_file(folder, name) for name in (MODELS_FILE, POOL_FILE, WAIVERS_FILE.name)
                if not (folder / name).exists()]
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.txt")) + borrowed:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def claim_run_folder(root: Path, cases_dir: Path, force: bool = False) -> None:
    """Mark a results folder as this case set's (its fingerprint, and the folder, for the commands that read the
    run later), or refuse a folder made with other case files."""
    fingerprint = cases_fingerprint(cases_dir)
    meta = _run_meta(root)
    if meta and meta.get("cases_fingerprint") != fingerprint and not force:
        raise GuardError(
            f"{root} holds records judged under other case files (fingerprint {meta.get('cases_fingerprint')}, "
            f"now {fingerprint}); resuming would mix verdicts. Use another --run-id, or --force to resume anyway")
    # The built-in cases as null: the run folder stays meaningful on another machine or installation.
    own = None if Path(cases_dir).resolve() == CASES_DIR.resolve() else str(Path(cases_dir).resolve())
    write_json_atomic(root / RUN_META, {"cases_fingerprint": fingerprint, "cases_dir": own})


def recorded_cases_dir(root: Path) -> Path:
    """The cases folder a run folder was made with: the one it recorded, else (the built-in cases, or a folder
    from before runs recorded it) the built-in one."""
    own = (_run_meta(root) or {}).get("cases_dir")
    return Path(own) if own else CASES_DIR


def cases_dir_for(given: str | Path | None, run_dir: Path | str | None = None) -> Path:
    """A command's cases folder: --cases-dir when given, else the one `run_dir` (if any) was made with."""
    if given:
        return Path(given)
    return recorded_cases_dir(Path(run_dir)) if run_dir else CASES_DIR


def _run_meta(root: Path) -> dict | None:
    try:
        meta = json.loads((Path(root) / RUN_META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def check_free_disk(path: Path, min_free_gb: float) -> None:
    probe = Path(path)
    while not probe.exists():
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 2**30
    if free_gb < min_free_gb:
        raise GuardError(f"only {free_gb:.1f} GiB free under {probe} (at least {min_free_gb:g} GiB wanted for "
                         f"records, logs and caches); free space or lower --min-free-gb")
