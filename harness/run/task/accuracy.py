"""What the runner needs for accuracy cases: the cell process's accuracy instructions, and why an accuracy cell
cannot run in this environment. That its baseline runs before it is the start order's
(harness/run/order/baselines.py)."""

from __future__ import annotations

import importlib.util
from typing import Any

from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.load import CASES_DIR
from kvmatrix.matrix.schema import ModelEntry

TASKS_DIR = CASES_DIR / "tasks"  # local lm-eval tasks: a folder per task with its YAML and data


def accuracy_spec(cell: Cell, use_hub: bool) -> dict[str, Any] | None:
    accuracy = cell.case.accuracy
    if accuracy is None:
        return None
    local = (TASKS_DIR / accuracy.task).is_dir()
    return {
        "task": accuracy.task, "metric": accuracy.metric, "limit": accuracy.limit,
        "num_fewshot": accuracy.num_fewshot, "include_path": str(TASKS_DIR),
        # Indexing lm-eval's thousands of built-in task files takes seconds: only a built-in task needs them.
        "include_defaults": not local,
        "offline": local or not use_hub,
    }


# What an accuracy cell needs beside vLLM: lm-eval in its process, scipy and statsmodels for the paired statistics.
ACCURACY_TOOLS = {"lm_eval": "lm-eval>=0.4.13,<0.5", "scipy": "scipy>=1.11", "statsmodels": "statsmodels>=0.14"}


def missing_accuracy_tools(cells: list[Cell]) -> str | None:
    """One line for the start of a run whose accuracy cells cannot be evaluated here (None: none, or all can): what
    is missing and how to get it, before any cell runs rather than as skips at the end."""
    accuracy = sum(1 for cell in cells if cell.case.accuracy is not None)
    missing = [spec for module, spec in ACCURACY_TOOLS.items() if importlib.util.find_spec(module) is None]
    if not accuracy or not missing:
        return None
    return (f"kvmatrix: {' '.join(m.split('>')[0] for m in missing)} not installed here: this run's {accuracy} "
            f"accuracy cells will be skipped (pip install {' '.join(repr(m) for m in missing)}, or put a folder "
            "holding them on PYTHONPATH)")


def offline_reason(cell: Cell, models: dict[str, ModelEntry], use_hub: bool) -> str | None:
    """Why a cell cannot run in this environment (a skip, with the reason): a model that exists only on the hub
    without hub access, or an accuracy cell where lm-eval is not installed (e.g. a GPU image without it)."""
    entry = models.get(cell.model)
    if entry is not None and entry.tiny is None and not use_hub:
        return f"needs hub access (--hub): {entry.hub_id} has no local build"
    if cell.case.accuracy is not None and importlib.util.find_spec("lm_eval") is None:
        return "lm-eval is not installed in this environment (accuracy cells need it)"
    return None
