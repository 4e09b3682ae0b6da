"""How long the matrix would take on more GPUs, from one run's measured cells: a model to size a nightly.

    PYTHONPATH=. python benchmarks/h200_scaling.py RUN [--gpus 1,2,4,8] [--hosts 1] [--slots-per-gpu 8]
                                                   [--cores-per-gpu 16]

RUN is a run folder (or a packed one, as benchmarks/h200_phases.py reads them) of one GPU class on one machine.
Each of its cells costs what it took there (`total_s`), less the start of a warm worker where it was a worker's
first cell (the imports and a first engine: every slot pays one, whatever it runs first). The model then
schedules the same cells as the runner does, longest first (harness/run/order/longest_first.py), each compared cell
after its oracle or baseline, and on a cold run each cell of a kernel family (harness/run/order/pilots.py) after the
family's first cell, on `gpus x slots-per-gpu` slots:

- one host with G GPUs shares one cache folder: a family's kernels are compiled once, by its first cell;
- `--hosts H` spreads the GPUs over H hosts (a Ray cluster): each host compiles every family it runs once, so a
  family's first cell on each host pays the cold cost;
- the host CPU bounds it too: the cells' CPU seconds (`timings.cpu_s`: their processes and the compilers they
  waited for) over the cores of the hosts that run them. The wall is the larger of the two.

It prints, per GPU count: the slot-bound wall, the CPU-bound wall, the larger, and the same model for the run's own
machine beside the run's measured wall (the check of the model). And how many slots the cores allow: the cores
one running cell kept busy on average (its CPU seconds over its wall seconds) into the cores per GPU.
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import tempfile
from pathlib import Path

from h200_phases import busy_wall, open_run, records_of  # beside this script

from kvmatrix.harness.judge.facts import facts
from kvmatrix.harness.record.phases import breakdown
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.order.baselines import baseline_gates
from kvmatrix.harness.run.order.longest_first import order_tasks
from kvmatrix.harness.run.order.pilots import kernel_family
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import load_cases, load_models, load_pool


def worker_start_s(records: list[dict]) -> float:
    """What a worker's first cell pays more than a later one: its imports and its first engine's setup (the
    model inspection, the lazy imports; harness/record/phases.py), medians; not its compiles, which are the
    kernels' (a cold run's first cells are often the JIT pilots)."""
    def start(r: dict) -> float:
        parts = breakdown(r.get("timings"))
        return parts.get("import", 0.0) + parts.get("engine_setup", 0.0)

    first = [start(r) for r in records if _first_in_process(r)]
    later = [start(r) for r in records if r.get("isolation") == "worker" and not _first_in_process(r)]
    return max(0.0, statistics.median(first) - statistics.median(later)) if first and later else 0.0


def _first_in_process(record: dict) -> bool:
    return record.get("isolation") == "process" or _first_in_worker(record)


def _first_in_worker(record: dict) -> bool:
    return record.get("isolation") == "worker" and (record.get("worker") or {}).get("cells_before") == 0


class Cells:
    """The run's cells as the runner would schedule them: costs, waits, kernel families."""

    def __init__(self, records: list[dict], cold: bool | None = None) -> None:
        ran = [r for r in records if (r.get("timings") or {}).get("total_s") and r.get("verdict") != "skip"]
        gpu_name = ran[0]["gpu_class"]
        pool = load_pool()
        cells = {c.cell_id: c for c in expand_all(load_cases(), load_models(), pool)}
        self.tasks = [Task(cells[r["cell_id"]], gpu_name, pool[gpu_name]) for r in ran if r["cell_id"] in cells]
        by_id = {r["cell_id"]: r for r in ran}
        self.start_s = worker_start_s(ran)
        # A fresh process (a confirmation) pays its own start wherever it runs; a worker's first cell leaves the
        # start to whichever cell its slot runs first.
        self.cost = {t.key: by_id[t.cell.cell_id]["timings"]["total_s"]
                     - (self.start_s if _first_in_worker(by_id[t.cell.cell_id]) else 0.0) for t in self.tasks}
        self.cpu = {t.key: (by_id[t.cell.cell_id]["timings"].get("cpu_s") or 0.0) for t in self.tasks}
        self.family = {t.key: kernel_family(t, facts(by_id[t.cell.cell_id]).get("backend")) for t in self.tasks}
        self.cold = cold if cold is not None else any((r.get("timings") or {}).get(k) for r in ran
                                                      for k in ("flashinfer_jit_s", "inductor_s"))
        expected = {t.cell.cell_id: self.cost[t.key] for t in self.tasks}
        self.order = order_tasks(self.tasks, expected)
        self.waits = baseline_gates(self.order)
        self.skipped = len(records) - len(self.tasks)


def simulate(cells: Cells, gpus: int, hosts: int, slots_per_gpu: int) -> float:
    """The wall time of the cells on `gpus` GPUs over `hosts` hosts, `slots_per_gpu` cells on each GPU."""
    slots = [(0.0, slot, slot * hosts // (gpus * slots_per_gpu)) for slot in range(gpus * slots_per_gpu)]
    heapq.heapify(slots)
    done: dict[str, float] = {}
    started_slots: set[int] = set()
    piloted: dict[tuple[int, str], float] = {}  # (host, family) -> when its first cell there ended
    pending = list(cells.order)
    while pending:
        free_at, slot, host = heapq.heappop(slots)
        task = next((t for t in pending if cells.waits[t.key] <= done.keys()), pending[0])
        pending.remove(task)
        ready = max([free_at, *(done.get(k, 0.0) for k in cells.waits[task.key])])
        family = (host, cells.family[task.key])
        cost = cells.cost[task.key] + (0.0 if slot in started_slots else cells.start_s)
        if cells.cold and family in piloted:
            ready = max(ready, piloted[family])
            cost = min(cost, _warm_cost(cells, task))
        end = ready + cost
        if cells.cold and family not in piloted:
            piloted[family] = end
        started_slots.add(slot)
        done[task.key] = end
        heapq.heappush(slots, (end, slot, host))
    return max(done.values(), default=0.0)


def _warm_cost(cells: Cells, task: Task) -> float:
    """A family member's cost once its kernels are built: the family's cheapest measured member at most."""
    family = cells.family[task.key]
    return min(cells.cost[t.key] for t in cells.tasks if cells.family[t.key] == family)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("--gpus", default="1,2,4,8")
    parser.add_argument("--hosts", type=int, default=1)
    parser.add_argument("--slots-per-gpu", type=int, default=8)
    parser.add_argument("--cores-per-gpu", type=int, default=16)
    parser.add_argument("--measured-slots", type=int, help="slots the run had (default: --slots-per-gpu)")
    parser.add_argument("--cold", action=argparse.BooleanOptionalAction,
                        help="whether the run compiled cold (default: whether a record shows a cold compile)")
    args = parser.parse_args()
    records = records_of(open_run(args.run, Path(tempfile.mkdtemp(prefix="kvm-scaling-"))))
    cells = Cells(records, args.cold)
    cpu_s, cell_s = sum(cells.cpu.values()), sum(cells.cost.values())
    busy = cpu_s / cell_s if cell_s else 0.0
    print(f"{len(cells.tasks)} cells ({cells.skipped} skipped or not in the cases), {'cold' if cells.cold else 'warm'}"
          f" run; a worker's start {cells.start_s:.0f} s; {cell_s:.0f} cell-seconds, {cpu_s:.0f} CPU-s")
    print(f"a running cell kept {busy:.2f} cores busy on average: {args.cores_per_gpu} cores allow "
          f"{args.cores_per_gpu / busy:.0f} slots per GPU before the CPU is the bound" if busy else "no CPU times")
    measured = args.measured_slots or args.slots_per_gpu
    model = max(simulate(cells, 1, 1, measured), cpu_s / args.cores_per_gpu)
    print(f"check: the run's own machine (1 GPU, {measured} slots) modelled {model:.0f} s, measured "
          f"{busy_wall(records):.0f} s busy wall\n")
    print(f"{'GPUs':>5} {'hosts':>5} {'slots':>5} {'slot-bound':>11} {'CPU-bound':>10} {'wall':>7}")
    for gpus in (int(g) for g in args.gpus.split(",")):
        hosts = min(args.hosts, gpus)
        slot_bound = simulate(cells, gpus, hosts, args.slots_per_gpu)
        cpu_bound = cpu_s / (args.cores_per_gpu * gpus)
        print(f"{gpus:>5} {hosts:>5} {gpus * args.slots_per_gpu:>5} {slot_bound:>10.0f}s {cpu_bound:>9.0f}s "
              f"{max(slot_bound, cpu_bound):>6.0f}s")


if __name__ == "__main__":
    main()
