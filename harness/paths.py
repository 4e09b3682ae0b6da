"""Where the repository is: what a cell process gets on its PYTHONPATH and runs in, what bisection builds its
environments from, and the default home of the shared caches."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = REPO_ROOT / ".cache"
