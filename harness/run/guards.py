"""Refusals before a run starts, so that a run never mixes what it should not: records judged under other case
files in one results folder, or a results folder on a disk about to fill up mid-run (a torn night)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import IO

from kvmatrix.harness.judge.waivers import WAIVERS_FILE
from kvmatrix.harness.record.files import write_json_atomic
from kvmatrix.matrix.data_file import read_data_file
from kvmatrix.matrix.load import CASES_DIR, MODELS_FILE, POOL_FILE, shared_file
from kvmatrix.matrix.schema import CaseError

RUN_META = "run.json"
LOCK_FILE = ".lock"  # held by the run writing the folder (lock_run_folder)


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
        digest.update(os.fsencode(path.name) + b"\0" + _fingerprinted(path) + b"\0")  # any name, UTF-8 or not
    return digest.hexdigest()[:16]


def _fingerprinted(path: Path) -> bytes:
    """A file's bytes as loading reads them; a file loading refuses (a device, a pipe, a link out of the folder, a
    20 GB notes.txt) by why, never read in full: it would hang the run or exhaust memory."""
    try:
        return read_data_file(path)
    except CaseError as err:
        return err.message.encode()


def lock_run_folder(root: Path) -> IO[str]:
    """Hold a results folder for this run: a second run with the same run id would run every cell again beside
    the first. The lock (flock on `.lock`) goes with the process, however it ends; keep the returned file open."""
    root.mkdir(parents=True, exist_ok=True)
    lock = (root / LOCK_FILE).open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise GuardError(f"{root} is in use by another kvmatrix run (pid {holder}); wait for it to end, or use "
                         "another --run-id") from None
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


# The run folders this process holds for the run writing them, by folder (`hold_run_folder`): a run's plan is a
# value, so the open lock file is kept here, not in it, until the run ends (`release_run_folder`) or the process does.
_HELD: dict[Path, IO[str]] = {}


def hold_run_folder(root: Path) -> None:
    """`lock_run_folder`, held until `release_run_folder` (or the process's end)."""
    _HELD[root] = lock_run_folder(root)


def release_run_folder(root: Path) -> None:
    held = _HELD.pop(root, None)
    if held is not None:
        held.close()


def claim_run_folder(root: Path, cases_dir: Path, force: bool = False) -> None:
    """Mark a results folder as this case set's (its fingerprint, and the folder, for the commands that read the
    run later), or refuse a folder made with other case files (or whose run.json cannot be read, unless `force`)."""
    fingerprint = cases_fingerprint(cases_dir)
    meta = _run_meta(root, force)
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


def _run_meta(root: Path, unreadable_as_none: bool = False) -> dict | None:
    """A run folder's run.json; None where it has none (a new folder, one from before run.json). One that cannot
    be read raises GuardError: taking it for none would resume the run with the built-in cases."""
    path = Path(root) / RUN_META
    try:
        meta = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        meta = f"{err}"
    if isinstance(meta, dict) and isinstance(meta.get("cases_dir"), str | None):
        return meta
    if unreadable_as_none:
        return None
    raise GuardError(f"{path} cannot be read ({str(meta)[:100]}): it says which case files the run was made with. "
                     "Restore it, or resume with --cases-dir naming them and --force")


def check_free_disk(path: Path, min_free_gb: float) -> None:
    if not (math.isfinite(min_free_gb) and min_free_gb >= 0):  # NaN compares false: it would turn the check off
        raise GuardError(f"--min-free-gb takes a number of GiB, 0 or more, not {min_free_gb}")
    probe = Path(path)
    while not probe.exists():
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 2**30
    if free_gb < min_free_gb:
        raise GuardError(f"only {free_gb:.1f} GiB free under {probe} (at least {min_free_gb:g} GiB wanted for "
                         f"records, logs and caches); free space or lower --min-free-gb")
