"""A run's settings as every executor and cell process sees them: the run folder, the models, the vLLM version,
the caches, the cell, worker and template commands and which of them start cells, the waivers, known failures and
date that judging is given, and the GPU-memory check. Frozen, contents too (`frozen`): a run's plan makes them once
(harness/run/plan.py), so no executor or cell sees them change under it: the models a run builds as its cells start
are that run's own (harness/run/task/runner.py `judged_record`'s `built`), never the settings'."""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NoReturn

from kvmatrix.harness.judge.known_failures import NONE_KNOWN, KnownFailures
from kvmatrix.harness.judge.waivers import Waiver
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.host.gpu_memory import GpuMemory
from kvmatrix.matrix.schema import ModelEntry

# The harness's own cell process and worker: what a template (harness/cell/template_server.py) forks instead.
CELL_COMMAND = (sys.executable, "-m", "kvmatrix.harness.cell")
WORKER_COMMAND = (sys.executable, "-m", "kvmatrix.harness.cell.worker")


class FrozenDict(dict):
    """A dict that refuses every change: what a run's settings hold, shared by its threads and shipped to Ray's nodes
    (a read-only view, `types.MappingProxyType`, cannot be pickled)."""

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a run's settings do not change once planned")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __reduce__(self) -> tuple:
        return FrozenDict, (dict(self),)


@dataclass(frozen=True)
class RunSettings:
    run_dir: RunDir
    models: dict[str, ModelEntry]
    built: dict[str, Path]  # models built before the run (a test's, a benchmark's): each cell builds what it lacks
    vllm_version: str | None
    cache_dir: Path
    use_hub: bool = False
    timeout_scale: float = 1.0
    env: dict[str, str] | None = None
    # The environment cells start from: the harness's own as the run began. What the runner's libraries set in it
    # later (sklearn's OpenMP variables as a model build imports transformers, inductor's cache folder) would
    # reach only the cells started after, or during, that build: they would differ in it from the cells before
    # and need a template and warm workers of their own (a default CPU matrix started a second template).
    environment: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    fresh_caches: bool = False  # each cell its own empty caches (benchmarks: what sharing saves)
    cell_command: tuple[str, ...] = CELL_COMMAND
    # "worker": each slot runs its cells in a warm worker (`worker_command`, harness/cell/worker.py), a failing
    # cell again in a fresh process; "process": every cell in a fresh process (`cell_command`).
    isolation: str = "process"
    worker_command: tuple[str, ...] = WORKER_COMMAND
    # Cell processes and workers forked from a template that imported torch and vLLM once (`template_command`,
    # harness/run/process/template_client.py) instead of each importing them: CPU classes only (a run's plan sets it; a
    # child forked after CUDA's initialisation cannot use CUDA).
    fork_from_template: bool = False
    template_command: tuple[str, ...] = (sys.executable, "-m", "kvmatrix.harness.cell.template_server")
    probe_only: bool = False  # cells that need only the resolved state run one short request (cell_mode)
    gpu_memory: GpuMemory | None = None  # where set, each cell's GPU is checked back at its baseline
    gpu_settle_s: float = 15.0  # how long a cell's GPU may take to free its memory before it counts as leaked
    waivers: Sequence[Waiver] = ()  # known failures (cases/_waivers.txt): judged xfail
    # What kvmatrix knows fails, for the run's cells of a user's case (harness/judge/known_failures.py), and the
    # date the run judges as of (which waivers have expired): read once, passed to every judgement.
    known_failures: KnownFailures = NONE_KNOWN
    today: datetime.date = field(default_factory=datetime.date.today)
    # GPUs of this machine a cell may span (0 on a CPU class); None where a scheduler places cells (Ray).
    gpus_here: int | None = None
    # The plainest cell first, nothing recorded until it ran, and the run stopped if it does not run
    # (harness/run/order/canary.py), on this machine's slots and on a Ray cluster alike: on in every run plan
    # (`kvmatrix run` and the pytest front end, harness/run/plan.py) but a bisection step's; off where a run's cells
    # misbehave on purpose (the fault tests).
    canary: bool = False


def frozen(settings: RunSettings) -> RunSettings:
    """The settings with every mapping and list they hold made one that refuses changes."""
    return replace(settings, models=FrozenDict(settings.models), built=FrozenDict(settings.built),
                   env=None if settings.env is None else FrozenDict(settings.env),
                   environment=FrozenDict(settings.environment), waivers=tuple(settings.waivers))
