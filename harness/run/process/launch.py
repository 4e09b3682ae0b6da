"""How a cell's spec becomes a finished cell, behind one `Launcher` protocol: `FreshProcess` starts one process
per cell (`python -m kvmatrix.harness.cell`), `WarmWorker` hands the cell to a slot's long-lived worker
(`python -m kvmatrix.harness.cell.worker`, harness/cell/worker.py), which has imported torch and vLLM already.
Either starts its processes through a `ProcessStart` (harness/run/process/start.py): the command run, or forked
from one of the run's templates (harness/run/process/template_client.py).

Either way the cell writes the same RESULT.json and log, and the launcher returns what only the parent knows: the
exit status (a worker's cell: the code it answered, or the worker's own exit status when it died in the cell),
whether the cell timed out, which isolation ran it and how its process started. A worker runs only cells that
share everything fixed before vLLM's import (the environment, the emulated class): a cell that needs other state
gets another worker (a slot keeps two). A worker that died, timed out or retired itself is gone; the slot starts a
fresh one when needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kvmatrix.harness.record.parts import ProcessStartedBy, WorkerInfo
from kvmatrix.harness.run.process.groups import CellProcesses
from kvmatrix.harness.run.process.start import (
    CellFiles,
    Exec,
    Process,
    ProcessStart,
    Requests,
    ShareKey,
    Started,
    end_process,
)

WORKER_EXIT_GRACE_S = 30.0  # a retiring worker's own exit; then it is killed


@dataclass
class Launched:
    returncode: int
    timed_out: bool
    isolation: str  # "process" or "worker"
    worker: WorkerInfo | None = None  # pid, cells it ran before this one, why it retired
    process_start: ProcessStartedBy = "exec"  # how the cell's (or its worker's) process started


class Launcher(Protocol):
    isolation: str

    def launch(self, files: CellFiles, env: dict[str, str], share_key: ShareKey, timeout: float,
               processes: CellProcesses, gpu: int | None) -> Launched:
        """Run the cell described by `files.spec` to its end (or its timeout); cells with another `share_key`
        (what is fixed before vLLM's import) must not run in the same process."""
        ...

    def close(self) -> None:
        """No process of this launcher outlives the call."""
        ...


@dataclass
class FreshProcess:
    """One process per cell: `command SPEC RESULT` in its own process group, its output into the cell's log."""

    command: tuple[str, ...]
    start: ProcessStart = field(default_factory=Exec)
    isolation: str = "process"

    def launch(self, files: CellFiles, env: dict[str, str], share_key: ShareKey, timeout: float,
               processes: CellProcesses, gpu: int | None) -> Launched:
        started = self.start.cell(self.command, files, env, share_key, processes, gpu)
        proc = started.proc
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            end_process(proc, processes)  # the whole group: vLLM may have started helpers that would outlive the cell
        if started.parent_lost():  # killed with its template, not by the cell: start it again
            return FreshProcess(self.command).launch(files, env, share_key, timeout, processes, gpu)
        return Launched(proc.returncode, timed_out, self.isolation, process_start=started.how)

    def close(self) -> None:
        pass


# Warm workers a slot keeps, each for other process-wide state (a case's `env:`): a slot that runs a case with
# its own environment and comes back finds its first worker still warm instead of paying the imports and a first
# engine again (on a cold H200, 16 workers were started only to switch between the default environment and
# glm5-fp8's). An idle worker holds its CUDA context and the workspaces it kept (at most 7 GiB,
# harness/vllm_compat/teardown.py).
WORKERS_PER_SLOT = 2


@dataclass
class _Worker:
    """One warm worker process: cells on its requests, answers on its replies."""

    started: Started
    processes: CellProcesses
    cells: int = 0

    @property
    def proc(self) -> Process:
        return self.started.proc

    @property
    def requests(self) -> Requests:
        assert self.started.requests is not None, "a worker is started with a request stream (ProcessStart.worker)"
        return self.started.requests

    def read_reply(self, timeout: float) -> tuple[dict | None, bool]:
        """The worker's answer for the cell; (None, timed out?) when it died or ran past `timeout`."""
        assert self.started.replies is not None, "a worker is started with a reply stream (ProcessStart.worker)"
        line = self.started.replies.readline(timeout)
        if line is None:
            return None, True
        if not line:  # the replies ended: the worker is gone
            self.proc.wait()
            return None, False
        return json.loads(line), False

    def close(self, grace_s: float = 0.0) -> None:
        """End the worker (given `grace_s` to exit by itself), its whole process group with it."""
        try:
            self.requests.close()  # end of requests: a healthy worker exits by itself
        except OSError:
            pass
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        end_process(self.proc, self.processes)
        if self.started.replies is not None:
            self.started.replies.close()


@dataclass
class WarmWorker:
    """A slot's long-lived workers: `command REPLY_FD`, cells as JSON lines on stdin (see harness/cell/worker.py).
    A worker starts on the first cell of its process-wide state (`share_key`); the slot keeps up to
    `keep` of them, the least recently used ending first, and replaces one that is gone."""

    command: tuple[str, ...]
    log_dir: Path
    start: ProcessStart = field(default_factory=Exec)
    isolation: str = "worker"
    keep: int = WORKERS_PER_SLOT
    _workers: dict[tuple, _Worker] = field(default_factory=dict, init=False, repr=False)  # least recent first

    def launch(self, files: CellFiles, env: dict[str, str], share_key: ShareKey, timeout: float,
               processes: CellProcesses, gpu: int | None) -> Launched:
        worker = self._workers.pop(share_key, None) or self._start(env, share_key, processes, gpu)
        self._workers[share_key] = worker  # the most recent last
        info: WorkerInfo = {"pid": worker.proc.pid, "cells_before": worker.cells}
        worker.cells += 1
        request = {"spec": str(files.spec), "result": str(files.result), "log": str(files.log)}
        files.log.write_bytes(b"")
        try:
            worker.requests.write(json.dumps(request) + "\n")
            worker.requests.flush()
        except OSError:  # died between cells
            pass
        reply, timed_out = worker.read_reply(timeout)
        if reply is None:  # died in the cell (a signal, an exit) or ran out of time: the worker is gone with it
            self._close(share_key)
            return Launched(worker.proc.returncode, timed_out, self.isolation, info, worker.started.how)
        if reply.get("retire"):
            info["retired"] = reply["retire"]
            self._close(share_key, grace_s=WORKER_EXIT_GRACE_S)
        info["teardown_s"] = reply.get("teardown_s")
        info["gpu_memory_left_mib"] = reply.get("gpu_memory_left_mib")
        return Launched(int(reply["code"]), False, self.isolation, info, worker.started.how)

    def close(self) -> None:
        for share_key in list(self._workers):
            self._close(share_key)

    def _close(self, share_key: tuple, grace_s: float = 0.0) -> None:
        self._workers.pop(share_key).close(grace_s)

    def _start(self, env: dict[str, str], share_key: ShareKey, processes: CellProcesses, gpu: int | None) -> _Worker:
        while len(self._workers) >= max(1, self.keep):
            self._close(next(iter(self._workers)))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"worker-{time.strftime('%H%M%S')}-{os.getpid()}-{id(self)}.log"
        return _Worker(self.start.worker(self.command, log, env, share_key, processes, gpu), processes)
