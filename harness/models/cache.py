"""Building a model folder once into a shared cache: idempotent, atomic, safe with concurrent builders."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import inspect
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_once(cache_dir: Path, folder: str, builder: Callable[[Path], None]) -> Path:
    """`cache_dir/folder`, built by `builder(tmp)` unless it exists. The build goes to a temp folder renamed into
    place, so concurrent callers and killed builds never leave a half model; a caller that finds another process
    building the folder waits for its build (the folder's lock file) instead of training the same model again."""
    cache_dir = Path(cache_dir)
    final = cache_dir / folder
    if final.is_dir():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Opened for reading: a lock file another user of a shared cache made is still one to wait on.
    lock_file = cache_dir / f".lock-{folder}"
    lock = os.open(lock_file, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):  # a file system without locks: concurrent builds, as before, still atomic
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when it closes, or when a killed builder's process ends
        if final.is_dir():
            return final
        try:
            return _build(cache_dir, final, builder)
        finally:
            # Removed once the folder is in place: a caller that opens a new lock file after this looks for the
            # folder again once it holds it, and finds it.
            with contextlib.suppress(OSError):
                lock_file.unlink()
    finally:
        os.close(lock)


def _build(cache_dir: Path, final: Path, builder: Callable[[Path], None]) -> Path:
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


# The libraries whose versions shape a built checkpoint's bytes.
_BUILD_LIBRARIES = ("torch", "tokenizers", "safetensors", "transformers")


def source_fingerprint(module_name: str, *also: str) -> str:
    """A builder module's source (and that of the modules it builds with) plus the library versions that shape
    the bytes: editing a builder rebuilds. Versions come from package metadata, so finding a cached model does not
    import torch."""
    src = "\0".join(inspect.getsource(sys.modules[name]) for name in (module_name, *also))
    libs = "\0".join(importlib.metadata.version(m) for m in _BUILD_LIBRARIES)
    return hashlib.sha256(f"{src}\0{libs}".encode()).hexdigest()[:12]


class BuilderFamily:
    """A module's builders (`name -> builder(out, **options)`) with their cache folders: `<name>-<option=value>...-
    <fingerprint of the module's source>`, so editing a builder rebuilds and unknown names or options fail before
    anything is built."""

    def __init__(self, module_name: str, builders: dict[str, Callable], also: tuple[str, ...] = ()):
        self.module_name, self.builders, self.also = module_name, builders, also

    @functools.cached_property
    def fingerprint(self) -> str:
        return source_fingerprint(self.module_name, *self.also)

    def folder_name(self, name: str, **options) -> str:
        if name not in self.builders:
            raise KeyError(f"unknown model builder {name!r}; known: {sorted(self.builders)}")
        inspect.signature(self.builders[name]).bind(None, **options)
        opts = "".join(f"-{k}={options[k]!r}" for k in sorted(options))
        return f"{name}{opts}-{self.fingerprint}".replace("/", "_").replace(" ", "")

    def build(self, name: str, cache_dir: Path, **options) -> Path:
        """Build (once) and return the checkpoint folder (build_once: idempotent, atomic, concurrent-safe)."""
        return build_once(cache_dir, self.folder_name(name, **options),
                          lambda out: self.builders[name](out, **options))
