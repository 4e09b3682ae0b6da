"""Why a task is a skip here, before anything starts: its case's rules for this class and vLLM, a draft this vLLM
cannot run, a hub-only model offline, an accuracy cell without lm-eval, fewer GPUs (or CPU ranks) than it spans, CUDA
graphs on a CPU class. The runner records such a task as a skip; the start order (the canary, the pilots) and the
model builds pass over it."""

from __future__ import annotations

from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.accuracy import offline_reason
from kvmatrix.harness.run.task.speculative import speculative_reason
from kvmatrix.harness.vllm_compat import GRAPH_EXECUTIONS
from kvmatrix.matrix.axes import resolved_execution


def not_run_reason(task: Task, settings: RunSettings) -> str | None:
    """Why a task is a skip here (its case's rules for this class and vLLM, a hub-only model offline, an accuracy
    cell without lm-eval); None for a task that runs."""
    return (task.cell.skip_reason(task.context(settings.vllm_version))
            or speculative_reason(task.cell, settings.models, settings.vllm_version)
            or offline_reason(task.cell, settings.models, settings.use_hub)
            or gpus_reason(task, settings.gpus_here)
            or execution_reason(task))


def execution_reason(task: Task) -> str | None:
    """Why a cell's execution cannot run on its class: CUDA graphs on a CPU class."""
    execution = resolved_execution(task.cell.axes["execution"], task.gpu.device)
    if execution in GRAPH_EXECUTIONS and task.gpu.device != "cuda":
        return f"execution {execution} captures CUDA graphs: CUDA graphs are GPU-only ({task.gpu_name} is a CPU class)"
    return None


def gpus_reason(task: Task, gpus_here: int | None) -> str | None:
    """Why a cell that spans several GPUs cannot run here: fewer GPUs of its class than its ranks (None: unknown
    here, as on a Ray cluster, whose scheduler places it)."""
    needed = task.cell.gpus_needed
    if needed <= 1 or gpus_here is None or needed <= gpus_here:
        return None
    axes = task.cell.axes
    ranks = f"tensor_parallel_size {axes['tensor_parallel_size']} x pipeline_parallel_size " \
            f"{axes['pipeline_parallel_size']}"
    if task.gpu.device == "cpu":
        return f"needs {needed} ranks ({ranks}): a CPU class runs them only with `kvmatrix run --cpu-ranks {needed}`"
    return f"needs {needed} GPUs of class {task.gpu_name} ({ranks}); this machine has {gpus_here}"
