"""Refusals before a run starts, so that a run never mixes what it should not: records judged under other case
files in one results folder, or a results folder on a disk about to fill up mid-run (a torn night)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from kvmatrix.harness.judge.waivers import WAIVERS_FILE
from kvmatrix.harness.records import write_json_atomic
from kvmatrix.matrix.load import MODELS_FILE, POOL_FILE, shared_file

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


def claim_run_folder(root: Path, fingerprint: str, force: bool = False) -> None:
    """Mark a results folder as this case set's, or refuse a folder made with other case files."""
    meta_path = root / RUN_META
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        meta = None
    if meta and meta.get("cases_fingerprint") != fingerprint and not force:
        raise GuardError(
            f"{root} holds records judged under other case files (fingerprint {meta.get('cases_fingerprint')}, "
            f"now {fingerprint}); resuming would mix verdicts. Use another --run-id, or --force to resume anyway")
    write_json_atomic(meta_path, {"cases_fingerprint": fingerprint})


def check_free_disk(path: Path, min_free_gb: float) -> None:
    probe = Path(path)
    while not probe.exists():
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 2**30
    if free_gb < min_free_gb:
        raise GuardError(f"only {free_gb:.1f} GiB free under {probe} (at least {min_free_gb:g} GiB wanted for "
                         f"records, logs and caches); free space or lower --min-free-gb")
