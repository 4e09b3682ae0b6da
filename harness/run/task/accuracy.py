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


def offline_reason(cell: Cell, models: dict[str, ModelEntry], use_hub: bool) -> str | None:
    """Why a cell cannot run in this environment (a skip, with the reason): a model that exists only on the hub
    without hub access, or an accuracy cell where lm-eval is not installed (e.g. a GPU image without it)."""
    entry = models.get(cell.model)
    if entry is not None and entry.tiny is None and not use_hub:
        return f"needs hub access (--hub): {entry.hub_id} has no local build"
    if cell.case.accuracy is not None and importlib.util.find_spec("lm_eval") is None:
        return "lm-eval is not installed in this environment (accuracy cells need it)"
    return None
