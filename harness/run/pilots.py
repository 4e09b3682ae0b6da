"""Pilot cells: on a cold machine, before a packed wave, one cell of each backend family runs first (alone in a
wave of pilots), so one cell compiles that family's JIT kernels into the run's shared caches while the others
wait, instead of every packed cell compiling the same kernels at once (a cold FlashInfer cell spent 150 s
compiling while three others compiled the same). A family is warm, and gets no pilot, once a cell of this vLLM
ran it with these caches: a marker file in the cache folder says so."""

from __future__ import annotations

from pathlib import Path

from harness.run.settings import RunSettings
from harness.task import Task


def backend_family(task: Task) -> str:
    """Cells of one family compile the same attention kernels: the forced backend (or vLLM's pick) and the KV
    dtypes its layers hold (an FP8 cache has its own kernel variants; an FP8 cache with skipped layers holds
    both, seen on the H200 as a second 145 s FlashInfer compile)."""
    axes = task.cell.axes
    kv = "fp8" if str(axes.get("kv_cache_dtype") or "auto").startswith("fp8") else "bf16"
    if kv == "fp8" and axes.get("kv_cache_dtype_skip_layers"):
        kv = "fp8+bf16"
    return f"{axes.get('attention_backend') or 'default'}-{kv}"


def pilots_first(waves: list[list[Task]], warm_families: set[str]) -> list[list[Task]]:
    """On a cold machine, before a packed wave: one pilot cell of each family not yet warm, in a wave of pilots,
    so that one cell compiles a family's JIT kernels while the others wait for the cache instead of all compiling
    them at once. Pilots of a forced backend start first: theirs are the long just-in-time compiles (FlashInfer),
    which the other slots' pilots then overlap. Only a cell compared with no other can be a pilot (a baseline
    runs before its cells)."""
    pilots: dict[str, Task] = {}
    for task in (t for wave in waves for t in wave):
        family = backend_family(task)
        if family not in warm_families and family not in pilots and task.cell.baseline_id in (None, task.cell.cell_id):
            pilots[family] = task
    chosen = {id(t) for t in pilots.values()}
    first = sorted(pilots.values(), key=lambda t: t.cell.axes.get("attention_backend") is None)  # stable
    rest = [[t for t in wave if id(t) not in chosen] for wave in waves]
    return [wave for wave in (first, *rest) if wave]


def _pilot_marker(settings: RunSettings, family: str) -> Path:
    return settings.cache_dir / "pilots" / f"vllm{settings.vllm_version}-{family}"


def warm_families(settings: RunSettings) -> set[str]:
    """Backend families whose kernels a cell of this vLLM already compiled into the run's caches."""
    folder = settings.cache_dir / "pilots"
    prefix = f"vllm{settings.vllm_version}-"
    return {p.name[len(prefix):] for p in folder.glob(f"{prefix}*")} if folder.is_dir() else set()


def mark_warm(settings: RunSettings, family: str) -> None:
    marker = _pilot_marker(settings, family)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
