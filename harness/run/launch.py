"""How a cell's spec becomes a finished cell, behind one `Launcher` protocol: `FreshProcess` starts one process
per cell (`python -m kvmatrix.harness.cell`), `WarmWorker` hands the cell to a slot's long-lived worker
(`python -m kvmatrix.harness.cell.worker`, harness/cell/worker.py), which has imported torch and vLLM already.

Either way the cell writes the same RESULT.json and log, and the launcher returns what only the parent knows: the
exit status (a worker's cell: the code it answered, or the worker's own exit status when it died in the cell),
whether the cell timed out, and which isolation ran it. A worker runs only cells that share everything fixed before
vLLM's import (the environment, the emulated class): a cell that needs other state gets another worker (a slot
keeps two). A worker that died, timed out or retired itself is gone; the slot starts a fresh one when needed.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from kvmatrix.harness.record.parts import WorkerInfo
from kvmatrix.harness.record.paths import CELL_CWD
from kvmatrix.harness.run.process import CellProcesses, die_with_parent, killpg

WORKER_EXIT_GRACE_S = 30.0  # a retiring worker's own exit; then it is killed


@dataclass
class Launched:
    returncode: int
    timed_out: bool
    isolation: str  # "process" or "worker"
    worker: WorkerInfo | None = None  # pid, cells it ran before this one, why it retired


@dataclass(frozen=True)
class CellFiles:
    spec: Path
    result: Path
    log: Path


class Launcher(Protocol):
    isolation: str

    def launch(self, files: CellFiles, env: dict[str, str], share_key: tuple, timeout: float,
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
    isolation: str = "process"

    def launch(self, files: CellFiles, env: dict[str, str], share_key: tuple, timeout: float,
               processes: CellProcesses, gpu: int | None) -> Launched:
        with files.log.open("wb") as out:
            proc = _start([*self.command, str(files.spec), str(files.result)], out, env, processes, gpu)
            try:
                proc.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _end(proc, processes)  # the whole group: vLLM may have started helpers that would outlive the cell
        return Launched(proc.returncode, timed_out, self.isolation)

    def close(self) -> None:
        pass


# Warm workers a slot keeps, each for other process-wide state (a case's `env:`): a slot that runs a case with
# its own environment and comes back finds its first worker still warm instead of paying the imports and a first
# engine again (on a cold H200, 16 workers were started only to switch between the default environment and
# glm5-fp8's). An idle worker holds its CUDA context and the workspaces it kept (at most 4 GiB).
WORKERS_PER_SLOT = 2


@dataclass
class _Worker:
    """One warm worker process: requests on its stdin, replies on its own pipe."""

    proc: subprocess.Popen
    reply: Any
    processes: CellProcesses
    cells: int = 0

    @property
    def requests(self) -> IO[str]:
        assert self.proc.stdin is not None, "a worker is started with its stdin a pipe (WarmWorkers._start)"
        return self.proc.stdin

    def read_reply(self, timeout: float) -> tuple[dict | None, bool]:
        """The worker's answer for the cell; (None, timed out?) when it died or ran past `timeout`."""
        ready, _, _ = select.select([self.reply], [], [], timeout)
        if not ready:
            return None, True
        line = self.reply.readline()
        if not line:  # the reply pipe closed: the worker is gone
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
        _end(self.proc, self.processes)
        self.reply.close()


@dataclass
class WarmWorker:
    """A slot's long-lived workers: `command REPLY_FD`, cells as JSON lines on stdin (see harness/cell/worker.py).
    A worker starts on the first cell of its process-wide state (`share_key`); the slot keeps up to
    `keep` of them, the least recently used ending first, and replaces one that is gone."""

    command: tuple[str, ...]
    log_dir: Path
    isolation: str = "worker"
    keep: int = WORKERS_PER_SLOT
    _workers: dict[tuple, _Worker] = field(default_factory=dict, init=False, repr=False)  # least recent first

    def launch(self, files: CellFiles, env: dict[str, str], share_key: tuple, timeout: float,
               processes: CellProcesses, gpu: int | None) -> Launched:
        worker = self._workers.pop(share_key, None) or self._start(env, processes, gpu)
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
            return Launched(worker.proc.returncode, timed_out, self.isolation, info)
        if reply.get("retire"):
            info["retired"] = reply["retire"]
            self._close(share_key, grace_s=WORKER_EXIT_GRACE_S)
        info["teardown_s"] = reply.get("teardown_s")
        info["gpu_memory_left_mib"] = reply.get("gpu_memory_left_mib")
        return Launched(int(reply["code"]), False, self.isolation, info)

    def close(self) -> None:
        for share_key in list(self._workers):
            self._close(share_key)

    def _close(self, share_key: tuple, grace_s: float = 0.0) -> None:
        self._workers.pop(share_key).close(grace_s)

    def _start(self, env: dict[str, str], processes: CellProcesses, gpu: int | None) -> _Worker:
        while len(self._workers) >= max(1, self.keep):
            self._close(next(iter(self._workers)))
        read_end, write_end = os.pipe()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"worker-{time.strftime('%H%M%S')}-{os.getpid()}-{id(self)}.log").open("ab") as out:
            proc = _start([*self.command, str(write_end)], out, env, processes, gpu, stdin=subprocess.PIPE,
                          pass_fds=(write_end,))
        os.close(write_end)
        return _Worker(proc, os.fdopen(read_end, "r"), processes)


def _start(command: list[str], out: Any, env: dict[str, str], processes: CellProcesses, gpu: int | None,
           **popen: Any) -> subprocess.Popen:
    """A cell or worker process in its own group, dying with the harness, its output into `out`."""
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=popen.pop("stdin", subprocess.DEVNULL),
                            env=env, cwd=CELL_CWD, start_new_session=True, preexec_fn=die_with_parent(os.getpid()),
                            text=True, **popen)
    processes.add(proc.pid, gpu)
    return proc


def _end(proc: subprocess.Popen, processes: CellProcesses | None) -> None:
    killpg(proc.pid)
    proc.wait()
    if processes is not None:
        processes.discard(proc.pid)
