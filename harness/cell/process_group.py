"""A cell process's own process group and its life tied to its parent's: for the processes the harness starts
(harness/run/process/groups.py) and those a template forks (harness/cell/template_server.py)."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


try:  # resolved once here: the forked child must not load libraries (another thread may hold the loader lock)
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None  # type: ignore[assignment]  # not Linux: no parent-death signal


def die_with_parent(parent: int) -> Callable[[], None]:
    """For the cell process before exec: Linux kills it if the harness dies (even by SIGKILL), so a killed harness
    leaves no cell running on. A harness that died between fork and this call is caught by the parent check.
    Elsewhere a no-op."""

    def arm() -> None:
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:
                os._exit(1)

    return arm


def killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
