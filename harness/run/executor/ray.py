"""Cells as Ray tasks, for a pool larger than one machine.

Each GPU class is a Ray resource: by default a custom resource `gpu_class:<class>` that every node of the class
declares with its slot count (`ray start --resources '{"gpu_class:L4": 4}'`), or, with `real_gpus`, Ray's own
`accelerator_type` with a GPU share of 1/slots_per_device (Ray then sets the task's CUDA_VISIBLE_DEVICES, which
the cell process inherits). A cell goes to a node of the class it really runs on (the host class when emulating)
and runs there exactly as locally (`judged_record`: one cell process, retries, judging) in a scratch run folder;
its record and log come back to the driver, which writes them into the run folder as `run_locally` does (same
`RunDir.write`, same resume: finished cells are not sent again).

A node that dies takes its running cells with it; Ray runs them again on another node of the class
(`max_retries`). A cell that cannot be observed (retries spent, or no live node of its class for
`unplaceable_after_s`) is reported as an `error` naming why and is not written, so that a rerun with the same run
id runs it again: every cell ends either in the run folder or in the returned records, none lost.

Every node needs this repository importable (on PYTHONPATH) in the same Python environment; tiny models are built
on a node whose disk lacks the driver's builds (the build is cached and atomic).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.record.files import RunDir, record_stem
from kvmatrix.harness.record.neighbours import neighbour_ids, neighbours_of
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord, finished_now
from kvmatrix.harness.run.order.baselines import in_waves
from kvmatrix.harness.run.order.canary import EnvironmentBroken, canary_failure
from kvmatrix.harness.run.order.policy import StartOrder
from kvmatrix.harness.run.process.groups import CellProcesses
from kvmatrix.harness.run.resume import OnRecord, finished_records
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.runner import judged_record, skip_record
from kvmatrix.matrix.schema import GpuClass


def host_class(task: Task) -> str:
    return task.emulated_from or task.gpu_name


def placement(task: Task, real_gpus: bool = False, gpu_classes: Mapping[str, GpuClass] | None = None,
              accelerator_types: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """(the Ray resource that marks nodes of the task's class, the task's Ray options)."""
    host, gpus = host_class(task), task.cell.gpus_needed
    slots = (gpu_classes or {}).get(host, task.gpu).slots_per_device
    if real_gpus:
        accelerator = (accelerator_types or {}).get(host, host)  # pool names are Ray's (H100, A100, L4) by default
        # A cell spanning several GPUs takes them whole (Ray sets its CUDA_VISIBLE_DEVICES to all of them).
        return f"accelerator_type:{accelerator}", {"num_cpus": 0, "num_gpus": gpus if gpus > 1 else 1 / slots,
                                                   "accelerator_type": accelerator}
    resource = f"gpu_class:{host}"
    return resource, {"num_cpus": 0, "resources": {resource: gpus * slots if gpus > 1 else 1}}


def run_on_node(task: Task, settings: RunSettings, neighbours: list[JudgedRecord]) -> tuple[JudgedRecord, bytes | None]:
    """On the node: the task's judged record and its cell log. The records it is compared with (its neighbours,
    record/neighbours.py) are written into the scratch run folder first, so that judging reads them as it would
    locally."""
    # Under the run's cache folder rather than /tmp: what a killed worker leaves is found, and cleared with it.
    (settings.cache_dir / "ray-scratch").mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=settings.cache_dir / "ray-scratch"))
    try:
        here = dataclasses.replace(settings, run_dir=RunDir(scratch / settings.run_dir.root.name))
        for neighbour in neighbours:
            here.run_dir.write(neighbour)
        # The cell builds the models this node lacks (judged_record: ensure_models), into a copy of its own.
        record = judged_record(task, here, CellProcesses())
        log = here.run_dir.log_path(task.cell.cell_id, task.gpu_name)
        return record, log.read_bytes() if record.get("log") and log.exists() else None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def unobserved_record(task: Task, settings: RunSettings, why: str) -> JudgedRecord:
    """A cell the cluster could not run: an `error` for the report, never a record file (a rerun runs it)."""
    why = f"{why} (not recorded: a rerun with the same run id runs it again)"
    record: JudgedRecord = {**skip_record(task, why, settings.run_dir.root.name), "status": "error",
                            "error_tail": why, "vllm_version": settings.vllm_version, "signature": None,
                            "finished_at": finished_now()}
    return judge_record(record, task, neighbours_of(task, settings.run_dir), settings.waivers, settings.today,
                        settings.known_failures)


def run_tasks_on_ray(
    tasks: list[Task],
    order: StartOrder,
    settings: RunSettings,
    on_record: OnRecord | None = None,
    real_gpus: bool = False,
    gpu_classes: Mapping[str, GpuClass] | None = None,
    accelerator_types: dict[str, str] | None = None,
    max_retries: int = 3,
    unplaceable_after_s: float = 60.0,
) -> list[JudgedRecord]:
    """`LocalExecutor.run` over a Ray cluster the caller has joined (`ray.init(address=...)`); same arguments and
    records, in the order of `tasks`. The start order's canary starts alone first, then each wave of the cells
    whose waits have finished (a compared cell after its neighbours), as Ray places them."""
    import ray  # only a Ray cluster needs Ray

    remote = ray.remote(run_on_node)
    run_dir, total = settings.run_dir, len(tasks)
    records, todo = finished_records(tasks, run_dir, settings.waivers, on_record, settings.today)

    def keep(task: Task, record: JudgedRecord, log: bytes | None, written: bool) -> None:
        if written:
            if log is not None:
                path = run_dir.log_path(task.cell.cell_id, task.gpu_name)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(log)
            run_dir.write(record)
        records[task.key] = record
        if on_record:
            on_record(record, len(records), total, False)

    sender = _Sender(ray, remote, settings, records, real_gpus, gpu_classes, accelerator_types, max_retries,
                     unplaceable_after_s)
    order = order.without(records.keys())
    if order.canary is not None:
        _canary_first(sender, order.canary, keep)
    rest = order.without({order.canary.key} if order.canary else set())
    for wave in in_waves([*rest.tasks, *rest.wide], rest.waits):  # each cell after what it waits for
        sender.send(wave, keep)
    return [records[t.key] for t in tasks if t.key in records]


@dataclasses.dataclass(frozen=True)
class _Sender:
    """Sends a wave of cells to the cluster and hands each result to `kept` as it comes."""

    ray: Any
    remote: Any
    settings: RunSettings
    records: dict[str, JudgedRecord]  # the finished ones, which a compared cell's neighbours are read from
    real_gpus: bool
    gpu_classes: Mapping[str, GpuClass] | None
    accelerator_types: dict[str, str] | None
    max_retries: int
    unplaceable_after_s: float

    def send(self, wave: list[Task], kept: Callable[..., None]) -> None:
        pending: dict = {}
        for task in wave:
            resource, options = placement(task, self.real_gpus, self.gpu_classes, self.accelerator_types)
            ref = self.remote.options(max_retries=self.max_retries, retry_exceptions=False, **options).remote(
                task, self.settings, _neighbours_of(task, self.records))
            pending[ref] = (task, resource)
        try:
            _drain(self.ray, pending, kept, self.settings, self.unplaceable_after_s)
        except BaseException:
            for ref in pending:  # the driver is stopping: no cell may run on unrecorded
                self.ray.cancel(ref, force=True)
            raise


def _canary_first(sender: _Sender, canary: Task, keep: Callable[..., None]) -> None:
    """The canary alone first, as on this machine's slots (harness/run/order/canary.py): its record is kept only if
    this environment runs it, else the run stops with EnvironmentBroken and nothing recorded."""
    held: list[tuple] = []
    sender.send([canary], lambda *result: held.append(result))
    for task, record, log, written in held:
        if why := canary_failure(task, record):
            raise EnvironmentBroken(why)
        keep(task, record, log, written)


def _neighbours_of(task: Task, records: dict[str, JudgedRecord]) -> list[JudgedRecord]:
    """The finished records a compared cell is judged against, as the local executor's cells read them from the
    run folder: every neighbour `neighbour_ids` names (the differential oracle's greedy tokens the cell also decodes
    teacher-forced); those the run lacks are not sent, and the judge says so."""
    found = [records.get(record_stem(other, task.gpu_name))
             for other in sorted(set(neighbour_ids(task.cell, task.gpu_name).values()))]
    return [record for record in found if record is not None]


def _drain(ray: Any, pending: dict[Any, tuple[Task, str]], keep: Callable[..., None], settings: RunSettings,
           unplaceable_after_s: float) -> None:
    """Collect results as they come; give up on cells whose class has had no live node for a while."""
    missing_since: dict[str, float] = {}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
        for ref in done:
            task, _ = pending.pop(ref)
            try:
                record, log = ray.get(ref)
            except ray.exceptions.RayError as err:  # the node died more often than max_retries, or Ray failed
                keep(task, unobserved_record(task, settings, f"lost on the Ray pool: {type(err).__name__}: "
                                             f"{str(err).splitlines()[0] if str(err) else ''}"), None, False)
                continue
            keep(task, record, log, True)
        live = ray.cluster_resources()
        now = time.monotonic()
        for ref, (task, resource) in list(pending.items()):
            if resource in live:
                missing_since.pop(resource, None)
            elif now - missing_since.setdefault(resource, now) >= unplaceable_after_s:
                ray.cancel(ref)
                del pending[ref]
                keep(task, unobserved_record(task, settings, f"no live node with resource {resource} for "
                                             f"{unplaceable_after_s:g} s"), None, False)


@dataclasses.dataclass(frozen=True)
class RayExecutor:
    """`run_tasks_on_ray` as an `Executor` (harness/run/executor/local.py), for a cluster the caller has joined;
    `gpu_classes`: the pool's classes (cases/_pool.yaml), whose `slots_per_device` share a node's GPUs among cells."""

    real_gpus: bool = False
    gpu_classes: Mapping[str, GpuClass] | None = None
    accelerator_types: dict[str, str] | None = None
    max_retries: int = 3
    unplaceable_after_s: float = 60.0

    def run(self, tasks: list[Task], order: StartOrder, settings: RunSettings,
            on_record: OnRecord | None = None) -> list[JudgedRecord]:
        return run_tasks_on_ray(tasks, order, settings, on_record, self.real_gpus, self.gpu_classes,
                                self.accelerator_types, self.max_retries, self.unplaceable_after_s)
