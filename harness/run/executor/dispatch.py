"""Which cell a free slot takes next: `run_gated` starts, `jobs` at a time, the first task in the start order whose
waits have finished (passing over one that would only wait in its slot); `run_on_whole_gpus` the cells spanning
several GPUs, each on GPUs no other cell uses meanwhile. An interrupted harness kills every running cell first."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager

from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.process.groups import CellProcesses


def run_gated(tasks: list[Task], waits: Mapping[str, AbstractSet[str]], one: Callable[[Task], None],
               processes: CellProcesses, jobs: int, builds: Callable[[Task], set[str]] = lambda task: set(),
               building_ahead: Callable[[], set[str]] = set,
               waits_for_its_worker: Callable[[Task, list[Task], list[Task]], bool] = lambda *_: False) -> None:
    """`jobs` cells at a time, each free slot taking the first task in order whose `waits` (task keys: its
    baseline, its family's pilot) have all finished, passing over one that would wait for a long model build a
    running cell (or `building_ahead`, the run's own) is doing (`builds`: such builds a task does as it starts)
    or whose environment has its share of the slots already (`waits_for_its_worker`, given the running and the
    pending tasks) while another is ready; an interrupted harness kills every running cell first."""
    pending, finished = list(tasks), set[str]()
    running: dict[Future, Task] = {}

    def next_ready() -> Task | None:
        ready = [t for t in pending if waits[t.key] <= finished]
        building = building_ahead().union(*map(builds, running.values()))
        # Such a cell would only wait for the build in its slot (on the 2-core CPU both slots once waited 90 s
        # for the accuracy model's training while cells of built models were ready).
        busy = list(running.values())
        return next((t for t in ready if not builds(t) & building and not waits_for_its_worker(t, busy, pending)),
                    ready[0] if ready else None)

    with _cell_threads(jobs, processes) as threads:
        while pending or running:
            while len(running) < jobs and (ready := next_ready()):
                pending.remove(ready)
                running[threads.submit(one, ready)] = ready
            if not running:  # only a wait on a task that is not in the list could leave work pending here
                raise RuntimeError(f"cells wait for cells that never run: {[t.key for t in pending][:5]}")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()
                finished.add(running.pop(future).key)


def run_on_whole_gpus(tasks: list[Task], devices: int, one: Callable[[Task, list[int]], None],
                       processes: CellProcesses) -> None:
    """Each task on `gpus_needed` GPUs no other cell uses meanwhile, as many at once as the GPUs allow, in order."""
    pending, free = list(tasks), list(range(devices))
    running: dict[Future, list[int]] = {}
    with _cell_threads(max(1, devices), processes) as threads:
        while pending or running:
            while pending and pending[0].cell.gpus_needed <= len(free):
                task = pending.pop(0)
                gpus, free = free[:task.cell.gpus_needed], free[task.cell.gpus_needed:]
                running[threads.submit(one, task, gpus)] = gpus
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()
                free = sorted(free + running.pop(future))


@contextmanager
def _cell_threads(workers: int, processes: CellProcesses) -> Iterator[ThreadPoolExecutor]:
    """Threads that each run a cell; an interrupted harness kills every running cell before it stops."""
    threads = ThreadPoolExecutor(max_workers=workers)
    try:
        yield threads
    except BaseException:
        processes.kill_all()
        threads.shutdown(wait=True, cancel_futures=True)
        raise
    threads.shutdown()
