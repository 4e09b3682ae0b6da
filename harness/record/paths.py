"""Where kvmatrix is, for what it starts and writes: a checkout (the Makefile's PYTHONPATH, an editable install) or
an installed wheel. Cell processes, bisection steps and surface reads import kvmatrix through `import_root()`, and
run in the checkout (as always) or, installed, in the working directory; caches live in the checkout's .cache/ or
the user's cache folder. Nothing here assumes the repository is present."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

# The folder holding harness/, matrix/, reports/ and cases/: the repository root, or the installed package.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
# The repository this kvmatrix runs from (its pyproject.toml beside those folders); None when installed.
CHECKOUT: Path | None = PACKAGE_ROOT if (PACKAGE_ROOT / "pyproject.toml").is_file() else None
# Where cell processes run: the checkout (relative paths in its cases and tests resolve there), else the caller's
# working directory (subprocess's cwd=None).
CELL_CWD: Path | None = CHECKOUT
_USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvmatrix"
DEFAULT_CACHE = CHECKOUT / ".cache" if CHECKOUT else _USER_CACHE


def import_root() -> Path:
    """A folder that, on a process's PYTHONPATH, makes this kvmatrix importable and adds nothing else: the checkout,
    or for an installed kvmatrix a folder holding only a link to the package (a bisection step's environment must
    not see this environment's site-packages, whose vLLM would shadow its own)."""
    if CHECKOUT:
        return CHECKOUT
    folder = Path(tempfile.gettempdir()) / f"kvmatrix-import-{hashlib.sha256(bytes(PACKAGE_ROOT)).hexdigest()[:12]}"
    link = folder / "kvmatrix"
    if not link.exists():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            link.symlink_to(PACKAGE_ROOT, target_is_directory=True)
        except FileExistsError:  # another process linked it first
            pass
    return folder
