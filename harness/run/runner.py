"""Running cells: one process per cell, in its own process group, with a timeout; records written as each cell
finishes, so that a crash, hang, segfault or kill of a cell (or of the harness) loses nothing already recorded.

The cell process (`python -m harness.cell`) writes what it learned after every phase; this side adds what only
the parent can know (exit status, timing, timeout, signal), classifies the failure and judges the record.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.judge.accuracy import judge_accuracy
from harness.judge.fingerprint import UNFINGERPRINTED_STATUSES, signal_of, stamp
from harness.judge.signatures import classify, last_exception_line
from harness.judge.verdict import judge
from harness.paths import REPO_ROOT
from harness.records import FAILING_VERDICTS, RunDir, read_json, record_stem, write_json_atomic
from harness.run.accuracy_plan import accuracy_spec, baselines_first, offline_reason
from harness.run.engine_args import cell_mode, engine_args_for, generation
from harness.run.gpu_memory import GpuMemory, physical_index
from harness.run.schedule import order_tasks
from harness.vllm_compat import ENVIRONMENT_SIGNATURES, NOT_EMULABLE_SIGNATURES, normalize_record
from matrix.expand import Cell
from matrix.schema import GpuClass, ModelEntry

LOG_CAP_BYTES = 2 * 1024 * 1024
PR_SET_PDEATHSIG = 1
# Above its baseline by more than this, a GPU no cell runs on holds memory a cell left behind (the driver's and
# allocator's own usage wobbles a little between runs).
GPU_LEAK_TOLERANCE_MIB = 256
GPU_POLL_S = 0.5
# The CUDA driver's own cache holds PTX compiled for this card (e.g. kernels shipped without its machine code).
CACHE_ENV = ("VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
             "CUDA_CACHE_PATH")
CACHE_FOLDERS = ("vllm", "flashinfer", "inductor", "triton", "cuda")


@dataclass(frozen=True)
class Task:
    """One cell on one GPU class (the class it reports as; `emulated_from` is the real one when emulating)."""

    cell: Cell
    gpu_name: str
    gpu: GpuClass
    emulated_from: str | None = None

    @property
    def key(self) -> str:
        return record_stem(self.cell.cell_id, self.gpu_name)


@dataclass
class RunSettings:
    run_dir: RunDir
    models: dict[str, ModelEntry]
    built: dict[str, Path]
    vllm_version: str | None
    cache_dir: Path
    use_hub: bool = False
    timeout_scale: float = 1.0
    env: dict[str, str] | None = None
    fresh_caches: bool = False  # each cell its own empty caches (benchmarks: what sharing saves)
    cell_command: tuple[str, ...] = (sys.executable, "-m", "harness.cell")
    probe_only: bool = False  # cells that need only the resolved state run one short request (cell_mode)
    gpu_memory: GpuMemory | None = None  # where set, each cell's GPU is checked back at its baseline
    gpu_settle_s: float = 15.0  # how long a cell's GPU may take to free its memory before it counts as leaked


def shared_cache_env(cache_dir: Path) -> dict[str, str]:
    """Compile and JIT caches shared by every cell of a run: kernels one cell builds serve the next."""
    folders = dict(zip(CACHE_ENV, CACHE_FOLDERS, strict=True))
    return {var: str(cache_dir / sub) for var, sub in folders.items()}


def cell_env(settings: RunSettings, extra: dict[str, str] | None = None, key: str = "") -> dict[str, str]:
    env = dict(os.environ)
    caches = settings.cache_dir / "fresh" / key if settings.fresh_caches else settings.cache_dir
    env.update(shared_cache_env(caches))
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault prints its Python frames: the crash fingerprint's site
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if env.get("VLLM_CPU_KVCACHE_SPACE") == "":
        del env["VLLM_CPU_KVCACHE_SPACE"]  # empty crashes the CPU backend; unset lets kv_cache_memory_bytes rule
    env.update(settings.env or {})
    env.update(extra or {})
    return env


def _cap_log(path: Path, cap: int = LOG_CAP_BYTES) -> None:
    """Keep a log's tail (where the error is) when a cell printed more than `cap` bytes."""
    size = path.stat().st_size if path.exists() else 0
    if size <= cap:
        return
    with path.open("rb") as f:
        f.seek(size - cap)
        tail = f.read()
    path.write_bytes(f"[kvmatrix: log capped, first {size - cap} bytes dropped]\n".encode() + tail)


def _tail(path: Path, n: int = 8000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode(errors="replace")


class CellProcesses:
    """The process groups of running cells (with the GPU each is pinned to), so that an interrupted harness kills
    every one of them and the GPU check knows which processes belong to cells still running; and the GPUs'
    baselines that check compares with (none: no check)."""

    def __init__(self, gpu_baselines: dict[int, GpuBaseline] | None = None) -> None:
        self._pgids: dict[int, int | None] = {}
        self._lock = threading.Lock()
        self.stopping = False
        self.gpu_baselines = gpu_baselines or {}

    def add(self, pgid: int, gpu: int | None = None) -> None:
        with self._lock:
            self._pgids[pgid] = gpu
            if self.stopping:  # started while the harness was being stopped
                _killpg(pgid)

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._pgids.pop(pgid, None)

    def running(self) -> dict[int, int | None]:
        """pgid → GPU index of every cell running now."""
        with self._lock:
            return dict(self._pgids)

    def keep_leak(self, gpu: int, pids: set[int], mib: float) -> None:
        """A reported leak becomes part of its GPU's baseline: the cells after the one that leaked are not blamed."""
        with self._lock:
            before = self.gpu_baselines[gpu]
            self.gpu_baselines[gpu] = GpuBaseline(before.used_mib + mib, before.pids | pids)

    def kill_all(self) -> None:
        """The harness is stopping: cells it kills now are not recorded, so a rerun runs them again."""
        self.stopping = True
        with self._lock:
            for pgid in list(self._pgids):
                _killpg(pgid)


try:  # resolved once here: the forked child must not load libraries (another thread may hold the loader lock)
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def _die_with_parent(parent: int) -> Callable[[], None]:
    """For the cell process before exec: Linux kills it if the harness dies (even by SIGKILL), so a killed harness
    leaves no cell running on. A harness that died between fork and this call is caught by the parent check.
    Elsewhere a no-op."""

    def arm() -> None:
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:
                os._exit(1)

    return arm


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_cell(task: Task, settings: RunSettings, processes: CellProcesses, extra_env: dict | None = None) -> dict:
    """Run one cell to a judged record (not yet written)."""
    cell, run_dir = task.cell, settings.run_dir
    log = run_dir.log_path(cell.cell_id, task.gpu_name)
    work = run_dir.root / "work"
    # Per harness process: two harnesses on one run folder (xdist workers, a rerun beside a run) never share files.
    stem = f"{task.key}.{os.getpid()}"
    spec_path, result_path = work / f"{stem}.spec.json", work / f"{stem}.result.json"
    result_path.unlink(missing_ok=True)
    record: dict[str, Any] = {
        "cell_id": cell.cell_id,
        "case": cell.case.name,
        "model": cell.model,
        "axes": cell.axes,
        "gpu_class": task.gpu_name,
        "emulated_from": task.emulated_from,
        "run_id": run_dir.root.name,
        # Which GPU of the machine ran the cell (its slot's pin), for reports of multi-GPU hosts.
        "gpu_index": (extra_env or {}).get("CUDA_VISIBLE_DEVICES"),
    }
    mode, full_because = cell_mode(cell, settings.probe_only)
    record["mode"] = mode
    if full_because:
        record["mode_note"] = full_because
    gpu = physical_index(record["gpu_index"])
    started = time.monotonic()
    try:
        engine_args = engine_args_for(cell, task.gpu, settings.models, settings.built, settings.use_hub,
                                      probe=mode == "probe", vllm_version=settings.vllm_version)
    except KeyError as err:
        return _finish(record, task, settings, {"status": "error", "error_tail": str(err.args[0])}, started)
    record["engine_args"] = engine_args
    spec = {
        "cell_id": cell.cell_id,
        "engine_args": engine_args,
        **generation(cell, mode),
        "emulate_capability": _capability(task),
        "emulate_cpu_isa": task.gpu.cpu_isa if task.emulated_from and task.gpu.device == "cpu" else None,
        "accuracy": accuracy_spec(cell, settings.use_hub),
    }
    write_json_atomic(spec_path, spec)
    log.parent.mkdir(parents=True, exist_ok=True)
    timeout = cell.case.timeout_s * settings.timeout_scale
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*settings.cell_command, str(spec_path), str(result_path)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=cell_env(settings, {**cell.case.env, **(extra_env or {})}, task.key), cwd=REPO_ROOT,
            start_new_session=True,
            preexec_fn=_die_with_parent(os.getpid()),
        )
        processes.add(proc.pid, gpu)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # The whole group: vLLM may have started helpers that would outlive the cell.
            _killpg(proc.pid)
            proc.wait()
            processes.discard(proc.pid)
    _cap_log(log)
    outcome = _outcome(proc.returncode, timed_out, timeout, _load_result(result_path), _tail(log))
    outcome["log"] = str(log.relative_to(run_dir.root))
    if settings.gpu_memory is not None and gpu in processes.gpu_baselines:
        outcome.update(check_gpu_memory(settings.gpu_memory, gpu, processes, settings.gpu_settle_s))
    return _finish(record, task, settings, outcome, started)


@dataclass(frozen=True)
class GpuBaseline:
    """A GPU before the run: the memory in use and the processes (not the harness's) that held it."""

    used_mib: float
    pids: frozenset[int]


def gpu_baselines(memory: GpuMemory, indices: set[int]) -> dict[int, GpuBaseline]:
    return {i: GpuBaseline(memory.used_mib(i), frozenset(memory.processes(i))) for i in indices}


def pinned_gpus(slot_env: Callable[[int], dict[str, str]] | None, jobs: int) -> set[int]:
    """The GPUs the slots are pinned to (plain indices; other pins are not checked)."""
    if slot_env is None:
        return set()
    pins = (physical_index(slot_env(slot).get("CUDA_VISIBLE_DEVICES")) for slot in range(max(1, jobs)))
    return {index for index in pins if index is not None}


def check_gpu_memory(memory: GpuMemory, gpu: int, processes: CellProcesses, settle_s: float) -> dict:
    """After a cell's process group is gone: wait (up to `settle_s`, returning as soon as it is) until its GPU
    is back at its baseline; the record's `gpu_memory`, and a `leak` line if it is not back.
    Processes of cells still running there are theirs, and while any runs the GPU's total is theirs too, so then
    only processes are checked (`exclusive` False)."""
    baseline = processes.gpu_baselines[gpu]
    started = time.monotonic()
    while True:
        running = processes.running()
        exclusive = gpu not in running.values()
        foreign = {pid: mib for pid, mib in memory.processes(gpu).items()
                   if pid not in baseline.pids and _pgid(pid) not in running}
        used = memory.used_mib(gpu)
        above = used - baseline.used_mib if exclusive else 0.0
        driver_level = not foreign and above > GPU_LEAK_TOLERANCE_MIB
        if not (foreign or driver_level) or time.monotonic() - started >= settle_s:
            break
        time.sleep(GPU_POLL_S)
    leaked = sum(foreign.values()) if foreign else (above if driver_level else 0.0)
    out: dict[str, Any] = {"gpu_memory": {
        "gpu_index": gpu, "baseline_mib": round(baseline.used_mib, 1), "after_mib": round(used, 1),
        "leaked_mib": round(leaked, 1), "leaked_pids": {str(pid): round(mib, 1) for pid, mib in foreign.items()},
        "exclusive": exclusive, "waited_s": round(time.monotonic() - started, 3),
    }}
    # Reported, never killed: a process the harness did not start may be an operator's (a notebook, a server).
    if foreign or driver_level:
        processes.keep_leak(gpu, set(foreign), leaked)
    if foreign:
        held = "1 process still holds" if len(foreign) == 1 else f"{len(foreign)} processes still hold"
        pids = ", ".join(str(pid) for pid in sorted(foreign))
        out["leak"] = f"{held} {leaked:.0f} MiB on GPU {gpu} after the cell ended: pids {pids}"
    elif driver_level:
        out["leak"] = (f"GPU {gpu} holds {leaked:.0f} MiB above its baseline after the cell ended, held by no "
                       "listed process (driver-level)")
    return out


def _pgid(pid: int) -> int | None:
    """The process group of a pid; None for one that is gone or not visible here."""
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _capability(task: Task) -> list[int] | None:
    if task.emulated_from is None or task.gpu.compute_capability is None:
        return None
    major, minor = task.gpu.compute_capability.split(".")
    return [int(major), int(minor)]


def _load_result(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _outcome(returncode: int, timed_out: bool, timeout: float, result: dict, log_tail: str) -> dict:
    """What happened to the cell process, from its result file (possibly partial), exit status and log."""
    outcome = dict(result)
    exception = result.get("exception") or {}
    text = "\n".join(filter(None, [exception.get("message"), exception.get("traceback_tail"), log_tail]))
    if timed_out:
        outcome["status"] = "timeout"
        outcome["error_tail"] = f"no result within {timeout:g} s (phase {result.get('phase', 'start')})"
    elif returncode < 0:
        name = signal.Signals(-returncode).name
        # SIGKILL/SIGTERM come from outside (OOM killer, an operator); other signals are the cell's own crash.
        outcome["status"] = "killed" if -returncode in (signal.SIGKILL, signal.SIGTERM) else "crash"
        outcome["signal"] = name
        outcome["error_tail"] = f"{name} in phase {result.get('phase', 'start')}: {last_exception_line(log_tail)}"
        outcome["signature"] = classify(text, result.get("vllm_version")) or f"signal_{name}"
    elif result.get("status") == "crash":
        message = exception.get("message") or ""
        outcome["error_tail"] = (f"{exception.get('type')}: {message}"[:500] if exception.get("type")
                                 else last_exception_line(log_tail))
        outcome["signature"] = classify(text, result.get("vllm_version"))
    elif result.get("status") == "ok" and result.get("phase") == "done":
        outcome["status"] = "ok"
    else:
        outcome["status"] = "error"
        outcome["error_tail"] = (f"cell process exited {returncode} without a complete result: "
                                 f"{last_exception_line(log_tail)}")
    stamp(outcome, log_tail)
    return outcome


def _finish(record: dict, task: Task, settings: RunSettings, outcome: dict, started: float) -> dict:
    record.update(outcome)
    record.setdefault("vllm_version", settings.vllm_version)
    record.setdefault("signature", None)
    timings = dict(record.get("timings") or {})
    timings["total_s"] = round(time.monotonic() - started, 3)
    record["timings"] = timings
    judge_record(record, task, settings.run_dir)
    record["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return record


def judge_record(record: dict, task: Task, run_dir: RunDir) -> dict:
    """Set a record's verdict, reason and per-rule results from the case's expectations (and the baseline's
    accuracy); also used to judge stored records again after a case or signature change."""
    context = task.cell.context(task.gpu_name, task.gpu, record.get("vllm_version"), task.emulated_from is not None)
    normalize_record(record)
    verdict, reason, results = judge(record, task.cell.case.expect, context)
    if task.cell.baseline_id is not None:
        verdict, reason = judge_accuracy(record, task.cell, run_dir, task.gpu_name, context, verdict, reason,
                                         results)
    record.pop("not_emulable", None)
    if task.emulated_from and record.get("signature") in NOT_EMULABLE_SIGNATURES:
        verdict, reason = "skip", f"not emulable on {task.emulated_from}: {record.get('error_tail')}"
        record["not_emulable"] = True
    elif record.get("signature") in ENVIRONMENT_SIGNATURES:
        verdict, reason = "error", f"environment, not vLLM: {record.get('error_tail')}"
    record.update(expectations=results, verdict=verdict, reason=reason, tags=list(task.cell.case.tags))
    return record


def reclassify(record: dict, run_dir: RunDir) -> None:
    """Name and fingerprint a stored failure again with the current signature table and fingerprint rules (its
    exception and log tail are kept); records of earlier harnesses get their fingerprint here."""
    if record.get("status") in UNFINGERPRINTED_STATUSES:
        return
    exception = record.get("exception") or {}
    log_tail = _tail(run_dir.root / record["log"]) if record.get("log") else ""
    if record.get("status") == "crash":
        text = "\n".join(filter(None, [exception.get("message"), exception.get("traceback_tail"), log_tail]))
        died_of = signal_of(record)
        record["signature"] = classify(text, record.get("vllm_version")) or (f"signal_{died_of}" if died_of else None)
    stamp(record, log_tail)


def skip_record(task: Task, reason: str, run_id: str) -> dict:
    return {
        "cell_id": task.cell.cell_id, "case": task.cell.case.name, "model": task.cell.model,
        "axes": task.cell.axes, "gpu_class": task.gpu_name, "emulated_from": task.emulated_from,
        "run_id": run_id, "status": "skipped", "verdict": "skip", "reason": reason, "expectations": [],
        "tags": list(task.cell.case.tags),
    }


def finished_records(
    tasks: list[Task], run_dir: RunDir, on_record: Callable[[dict, int, int, bool], None] | None = None
) -> tuple[dict[str, dict], list[Task]]:
    """Resuming: (the records already in the run folder by task key, the tasks still to run)."""
    records: dict[str, dict] = {}
    todo = []
    for task in tasks:
        existing = read_json(run_dir.record_path(task.cell.cell_id, task.gpu_name))
        if existing is not None:
            records[task.key] = existing
            if on_record:
                on_record(existing, len(records), len(tasks), True)
        else:
            todo.append(task)
    return records, todo


def cell_record(task: Task, settings: RunSettings, processes: CellProcesses, extra_env: dict | None = None) -> dict:
    """The judged record of one task: a skip, or its cell run (again, `retries` times, while it fails)."""
    context = task.cell.context(task.gpu_name, task.gpu, settings.vllm_version, task.emulated_from is not None)
    reason = task.cell.skip_reason(context) or offline_reason(task.cell, settings.models, settings.use_hub)
    if reason:
        return skip_record(task, reason, settings.run_dir.root.name)
    record = run_cell(task, settings, processes, extra_env)
    retries = task.cell.case.retries
    while record["verdict"] in FAILING_VERDICTS and retries > 0:
        retries -= 1
        retry = run_cell(task, settings, processes, extra_env)
        if retry["verdict"] == "pass":
            retry.update(verdict="fail", flaky=True, reason=f"flaky: failed first ({record['reason']}), then passed")
        record = retry
    return record


def run_tasks(
    tasks: list[Task],
    settings: RunSettings,
    jobs: int = 1,
    on_record: Callable[[dict, int, int, bool], None] | None = None,
    slot_env: Callable[[int], dict[str, str]] | None = None,
    expected_s: dict[str, float] | None = None,
    last_verdicts: dict[str, str] | None = None,
) -> list[dict]:
    """Run every task not already recorded in the run folder; returns all records, finished ones included, in
    the order of `tasks`.

    `on_record(record, done, total, resumed)` is called once per cell as it finishes (progress lines).
    `slot_env(slot)` gives each concurrent slot its environment (e.g. CUDA_VISIBLE_DEVICES for its GPU).
    `expected_s` (cell id → expected seconds, e.g. the last run's) starts cells longest first, grouped by model
    and backend (harness/run/schedule.py), cells whose `last_verdicts` failed first; without it they start in the
    given order.
    """
    run_dir, total = settings.run_dir, len(tasks)
    records, todo = finished_records(tasks, run_dir, on_record)
    if expected_s is not None:
        todo = order_tasks(todo, expected_s, last_verdicts=last_verdicts)
    # Before any cell starts: what the slots' GPUs hold that is not this run's.
    baselines = (gpu_baselines(settings.gpu_memory, pinned_gpus(slot_env, jobs))
                 if settings.gpu_memory is not None else None)
    processes = CellProcesses(baselines)
    lock = threading.Lock()
    free_slots = list(range(max(1, jobs)))

    def one(task: Task) -> None:
        if processes.stopping:
            return
        with lock:
            slot = free_slots.pop()
        try:
            record = cell_record(task, settings, processes, slot_env(slot) if slot_env else None)
            if processes.stopping:
                return
            run_dir.write(record)
        finally:
            with lock:
                free_slots.append(slot)
        with lock:
            records[task.key] = record
            if on_record:
                on_record(record, len(records), total, False)

    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        for wave in baselines_first(todo):  # a compared cell reads its baseline's finished record
            futures = [pool.submit(one, t) for t in wave]
            for f in futures:
                f.result()
    except BaseException:
        processes.kill_all()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    return [records[t.key] for t in tasks if t.key in records]
