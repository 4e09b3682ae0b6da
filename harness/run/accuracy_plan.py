"""What the runner needs for accuracy cases: the cell process's accuracy instructions, and the rule that every
baseline cell has finished before a cell that is compared with it starts (as waves for the Ray pool, as each
cell's wait for this machine's pool)."""

from __future__ import annotations

import importlib.util
from typing import Any

from matrix.expand import Cell
from matrix.load import CASES_DIR
from matrix.schema import ModelEntry

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


def baselines_first(tasks: list) -> list[list]:
    """Two waves: the cells others are compared with, then the rest (each wave may run in parallel)."""
    first = [t for t in tasks if t.cell.baseline_id == t.cell.cell_id]
    rest = [t for t in tasks if t.cell.baseline_id != t.cell.cell_id]
    return [wave for wave in (first, rest) if wave]


def baseline_gates(tasks: list) -> dict[str, set[str]]:
    """Which task keys each task waits for: a compared cell, its baseline's task when that runs too (the same
    GPU class; a baseline already recorded waits for nothing)."""
    keys = {(t.cell.cell_id, t.gpu_name): t.key for t in tasks}
    return {t.key: {keys[(t.cell.baseline_id, t.gpu_name)]}
            if t.cell.baseline_id not in (None, t.cell.cell_id) and (t.cell.baseline_id, t.gpu_name) in keys
            else set() for t in tasks}


def offline_reason(cell: Cell, models: dict[str, ModelEntry], use_hub: bool) -> str | None:
    """Why a cell cannot run in this environment (a skip, with the reason): a model that exists only on the hub
    without hub access, or an accuracy cell where lm-eval is not installed (e.g. a GPU image without it)."""
    entry = models.get(cell.model)
    if entry is not None and entry.tiny is None and not use_hub:
        return f"needs hub access (--hub): {entry.hub_id} has no local build"
    if cell.case.accuracy is not None and importlib.util.find_spec("lm_eval") is None:
        return "lm-eval is not installed in this environment (accuracy cells need it)"
    return None
