"""What the runner needs for accuracy cases: the cell process's accuracy instructions, and the rule that every
baseline cell (and every differential cell's oracle) has finished before a cell that is compared with it starts
(as waves for the Ray executor, as each cell's wait on this machine's slots: harness/run/order/baselines.py)."""

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


def baselines_first(tasks: list) -> list[list]:
    """Waves (each may run in parallel), each task in the first wave after every task it waits for
    (`baseline_gates`: its accuracy baseline, its differential oracle): every cell compared with another runs
    after it. Tasks that wait for each other are an error of the plan, named before anything runs."""
    gates = baseline_gates(tasks)
    waves: list[list] = []
    done: set[str] = set()
    left = list(tasks)
    while left:
        wave = [t for t in left if gates[t.key] <= done]
        if not wave:
            raise ValueError(f"cells wait for each other: {[t.key for t in left][:5]}")
        waves.append(wave)
        done |= {t.key for t in wave}
        left = [t for t in left if t.key not in done]
    return waves


def baseline_gates(tasks: list) -> dict[str, set[str]]:
    """Which task keys each task waits for: a compared cell, its accuracy baseline's task, its differential
    oracle's and its speculative twins' (Cell.compared_with), when those run too (the same GPU class; one
    already recorded waits for nothing)."""
    keys = {(t.cell.cell_id, t.gpu_name): t.key for t in tasks}
    gates: dict[str, set[str]] = {}
    for t in tasks:
        others: set[str | None] = set(t.cell.compared_with(t.gpu_name))
        if t.cell.baseline_id != t.cell.cell_id:
            others.add(t.cell.baseline_id)
        gates[t.key] = {keys[(o, t.gpu_name)] for o in others if o is not None and (o, t.gpu_name) in keys}
    return gates


def offline_reason(cell: Cell, models: dict[str, ModelEntry], use_hub: bool) -> str | None:
    """Why a cell cannot run in this environment (a skip, with the reason): a model that exists only on the hub
    without hub access, or an accuracy cell where lm-eval is not installed (e.g. a GPU image without it)."""
    entry = models.get(cell.model)
    if entry is not None and entry.tiny is None and not use_hub:
        return f"needs hub access (--hub): {entry.hub_id} has no local build"
    if cell.case.accuracy is not None and importlib.util.find_spec("lm_eval") is None:
        return "lm-eval is not installed in this environment (accuracy cells need it)"
    return None
