"""Pilots: with several slots on a cold machine, one cell of each kernel family compiles
its kernels while the family's other cells wait for it; unless the order is a history's (longest first), the
pilots lead, and those of a forced backend that compiles per KV dtype (the long JIT builds, a cold run's critical
path) start ahead of all.

Pilot cells: on a cold machine one cell of each kernel family (model, backend, KV dtypes) runs first, so that one
cell compiles that family's JIT kernels into the run's shared caches while the family's other cells wait for it,
instead of every packed cell compiling the same kernels at once (a cold FlashInfer cell spent 150 s compiling while
three others compiled the same). Only the family waits: the other slots go on with cells of other families (on a
cold H200, pilots run as a barrier wave left two of four slots idle for 140 s behind the FlashInfer compiles). A
family is warm, and gets no pilot, once a cell of this vLLM ran it with these caches: a marker file in the cache
folder says so."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote, unquote

from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.order.policy import StartContext, StartOrder
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.skips import not_run_reason
from kvmatrix.harness.vllm_compat import compiles_per_kv_dtype


def kernel_family(task: Task, backend: str | None = None) -> str:
    """Cells of one family compile the same kernels: the model (its own kernels: a hybrid's Mamba layers, a
    sparse-MLA indexer, MoE; on the H200 three cold glm5-fp8 cells compiled the same ones side by side for 115 s,
    and with families across models, FlashAttention cells that compile nothing waited 121 s for the Nemotron-H
    pilot) and the attention backend: the forced one, else `backend`, what vLLM picked for this cell last time
    (the history's), else vLLM's unknown pick. The KV dtypes its layers hold split a family where the backend
    compiles per KV dtype or is unknown (each FP8 format has its own FlashInfer modules: fp8_e5m2 compiled for
    100 s after the fp8 pilot; an FP8 cache with skipped layers holds both, seen on the H200 as a second 145 s
    compile). A prebuilt backend holds every dtype already, and there the model's kernels are the compile: two
    cold Nemotron-H cells on FlashAttention, auto and fp8, each warmed the same Mamba kernels for 156 s side by
    side."""
    axes = task.cell.axes
    backend = axes.get("attention_backend") or backend
    if backend and not compiles_per_kv_dtype(backend):
        return f"{task.cell.model}:{backend}"
    dtype = str(axes.get("kv_cache_dtype") or "auto")
    kv = dtype if dtype.startswith("fp8") else "bf16"
    if kv != "bf16" and axes.get("kv_cache_dtype_skip_layers"):
        kv = f"{kv}+bf16"
    return f"{task.cell.model}:{backend or 'default'}-{kv}"


def pilot_gates(tasks: list[Task], warm_families: set[str], can_pilot: set[str] | None = None,
                pilots_first: bool = True, backends: dict[str, str] | None = None
                ) -> tuple[list[Task], dict[str, set[str]]]:
    """On a cold machine: (the tasks with one pilot cell of each family not yet warm moved to the front, which
    task keys each task waits for). A cell of a cold family waits for its family's pilot only, so one cell
    compiles a family's JIT kernels while the other slots run cells of families already warm or piloted,
    instead of every packed cell compiling the same kernels at once, or every slot waiting for the slowest
    pilot. Pilots of a forced backend start first: theirs are the long just-in-time compiles (FlashInfer).
    Only a cell compared with no other can be a pilot (a baseline runs before its cells), and only one in
    `can_pilot` (task keys: cells that run here and are expected to pass; a skip or a crash at load compiles
    nothing), if given. `pilots_first` False keeps the given order (a history's, longest first: moving every
    family's pilot ahead would start a 244 s FlashInfer cell expected to fail after 35 short pilots).
    `backends` (cell id → the backend vLLM picked for it last time) places cells without a forced backend."""
    backends = backends or {}
    families = {t.key: kernel_family(t, backends.get(t.cell.cell_id)) for t in tasks}
    pilots: dict[str, Task] = {}
    for task in tasks:
        family = families[task.key]
        if (family not in warm_families and family not in pilots and task.cell.baseline_id in (None, task.cell.cell_id)
                and (can_pilot is None or task.key in can_pilot)):
            pilots[family] = task
    chosen = {t.key for t in pilots.values()}
    # A pilot's model reference waits for no pilot: the pilot waits for it.
    chosen |= {t.key for t in tasks if (t.cell.cell_id, t.gpu_name) in
               {(p.cell.reference_on(p.gpu_name), p.gpu_name) for p in pilots.values()}}
    first = sorted(pilots.values(), key=lambda t: t.cell.axes.get("attention_backend") is None)  # stable
    waits = {t.key: set() if t.key in chosen or families[t.key] not in pilots else {pilots[families[t.key]].key}
             for t in tasks}
    chosen = {t.key for t in pilots.values()}
    return (first + [t for t in tasks if t.key not in chosen] if pilots_first else tasks), waits


def _pilot_marker(settings: RunSettings, family: str) -> Path:
    # Quoted: a family names every backend of a cell whose layers use several ("A/B"), and a "/" in a file name
    # is a folder (on the H200 such a marker beside its family's single-backend one ended the run).
    return settings.cache_dir / "pilots" / quote(f"vllm{settings.vllm_version}-{family}", safe="")


def warm_families(settings: RunSettings) -> set[str]:
    """Backend families whose kernels a cell of this vLLM already compiled into the run's caches."""
    folder = settings.cache_dir / "pilots"
    prefix = f"vllm{settings.vllm_version}-"
    names = [unquote(p.name) for p in folder.iterdir()] if folder.is_dir() else []
    return {name[len(prefix):] for name in names if name.startswith(prefix)}


def mark_warm(settings: RunSettings, family: str) -> None:
    """Best effort: a marker that cannot be written costs a later run a pilot, never this run."""
    marker = _pilot_marker(settings, family)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError as err:
        print(f"kvmatrix: could not mark kernel family {family!r} warm: {err}", file=sys.stderr)


class PilotsAhead:
    def order(self, draft: StartOrder, context: StartContext) -> StartOrder:
        if context.slots <= 1:
            return draft
        settings, timed = context.settings, context.past.timed
        # A compared cell waits for its oracle (or twins), so it cannot be the pilot they wait for; one that waits
        # only for its model reference (a short eager bf16 cell) can: the reference leads with it.
        can_pilot = {t.key for t in draft.tasks if context.expected_failure[t.key] is None
                     and not_run_reason(t, settings) is None
                     and not t.cell.compared_with(t.gpu_name) - {t.cell.reference_on(t.gpu_name)}}
        tasks, pilot_waits = pilot_gates(list(draft.tasks), warm_families(settings), can_pilot,
                                         pilots_first=not timed, backends=dict(context.past.backends))
        draft = replace(draft.with_waits(pilot_waits), tasks=tuple(tasks))
        if timed:
            return draft
        pilots = set().union(*pilot_waits.values())
        lead = [t for t in tasks if t.key in pilots and compiles_per_kv_dtype(t.cell.axes["attention_backend"] or "")]
        return replace(draft, first=draft.first + tuple(_with_references(lead, tasks)))


def _with_references(lead: list[Task], tasks: list[Task]) -> list[Task]:
    """The leading pilots, each after its model reference (once), which it waits for."""
    by_id = {(t.cell.cell_id, t.gpu_name): t for t in tasks}
    out: list[Task] = []
    for pilot in lead:
        reference_id = pilot.cell.reference_on(pilot.gpu_name)
        reference = by_id.get((reference_id, pilot.gpu_name)) if reference_id is not None else None
        out += [reference] if reference is not None and reference not in out else []
        out.append(pilot)
    return out
