"""Building a model folder once into a shared cache: idempotent, atomic, safe with concurrent builders."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_once(cache_dir: Path, folder: str, builder: Callable[[Path], None]) -> Path:
    """`cache_dir/folder`, built by `builder(tmp)` unless it exists. The build goes to a temp folder renamed into
    place, so concurrent callers and killed builds never leave a half model."""
    cache_dir = Path(cache_dir)
    final = cache_dir / folder
    if final.is_dir():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    _remove_orphans(cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-{final.name}-", dir=cache_dir))
    try:
        builder(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it 0700; a shared cache must be readable by other users
        for f in tmp.iterdir():
            f.chmod(0o644)
        try:
            os.rename(tmp, final)  # atomic; fails if a concurrent builder got there first
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _remove_orphans(cache_dir: Path) -> None:
    """Delete temp folders whose builder process is gone (a killed build); live builders' stay."""
    for p in cache_dir.glob(".tmp-*"):
        try:
            pid = int(p.name.split("-")[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except (PermissionError, ValueError, IndexError):
            pass
