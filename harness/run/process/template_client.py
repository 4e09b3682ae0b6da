"""A run's templates, the runner's side: processes that imported torch and vLLM once and fork the run's cell
processes and warm workers (harness/cell/template_server.py), as a `ProcessStart` the launchers use like `Exec`.

On a 2-core CPU a process start costs about 30 s before its first engine is built (the imports, and the first
engine's lazy ones); a forked child builds its first engine at once. Forking after the imports is safe only
without CUDA (a child cannot use a CUDA context its parent initialised), so only CPU runs use templates.

One template per `template_key`: what is fixed before vLLM's import (the environment, the emulation) but the
variables a forked child sets for itself (vllm_compat.AFTER_IMPORT_ENV: the slot's threads and cores), so every
slot of the run forks from it. A template starts on the first process its key needs, and nothing is misjudged
when it cannot be used: one that fails to start or to import (a broken environment: the cell, started as a process
of its own, records the import error as always), refuses to fork (another thread alive) or dies makes its key's
processes start by `Exec` for the rest of the run, said once on the run's output. A forked child is killed and
reported as a process the runner started is (its process group; its exit status or signal).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmatrix.harness.run.process.groups import CellProcesses, killpg
from kvmatrix.harness.run.process.start import CellFiles, Exec, Lines, ShareKey, Started, popen_own_group
from kvmatrix.harness.vllm_compat import AFTER_IMPORT_ENV

READY_TIMEOUT_S = 600.0  # the imports: ~30 s on a 2-core CPU, more on a busy one
PID_TIMEOUT_S = 30.0  # a fork's answer


# A template's socket lives in a folder of the temporary folder named by the runner's pid: a runner killed by
# SIGKILL cannot remove it, so each run removes those of runners that are gone.
SOCKET_FOLDER_PREFIX = "kvmatrix-template-"
_OWNER = re.compile(re.escape(SOCKET_FOLDER_PREFIX) + r"(\d+)-")


def remove_stale_socket_folders() -> None:
    """Remove the socket folders that runners no longer running left in the temporary folder."""
    for folder in Path(tempfile.gettempdir()).glob(f"{SOCKET_FOLDER_PREFIX}*"):
        owner = _OWNER.match(folder.name)
        if owner and not _alive(int(owner.group(1))):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def template_key(share_key: ShareKey) -> ShareKey:
    """The share key without the variables a forked child sets after the imports."""
    env = tuple((name, value) for name, value in share_key.env if name not in AFTER_IMPORT_ENV)
    return share_key._replace(env=env)


class _Requests:
    """A forked worker's request stream: closing it ends the worker's requests (its stdin's end)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn

    def write(self, text: str) -> int:
        self.conn.sendall(text.encode())
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.conn.shutdown(socket.SHUT_WR)


class ForkedProcess:
    """A child a template forked, as the launchers use a subprocess.Popen (pid, returncode, wait), with its
    connection: a worker's requests and replies, and the template's report of its end ({"exit": status})."""

    def __init__(self, conn: socket.socket, lines: Lines, pid: int) -> None:
        self.conn, self.lines, self.pid = conn, lines, pid
        self.returncode: int | None = None
        self.template_lost = False  # the connection ended without an exit status: the template died
        self.requests = _Requests(conn)

    def readline(self, timeout: float | None) -> str | None:
        """The child's next line (a worker's reply); "" once it has ended; None when nothing came in `timeout`."""
        if self.returncode is not None:
            return ""
        line = self.lines.readline(timeout)
        if line is None:
            return None
        ended = json.loads(line) if line else {}
        if "exit" in ended or not line:
            # A child outlives no template: it was killed with it (its parent-death signal).
            self.template_lost = not line
            self.returncode = int(ended.get("exit", -signal.SIGKILL))
            return ""
        return line

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status, once the template reported it; what a worker still answered is dropped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self.readline(left) is None:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0.0)
        return self.returncode

    def close(self) -> None:
        self.conn.close()


@dataclass
class _Template:
    proc: subprocess.Popen
    folder: Path  # holds the socket

    @property
    def socket_path(self) -> str:
        return str(self.folder / "socket")

    def fork(self, request: dict[str, Any]) -> ForkedProcess | None:
        """The child the request asks for; None when the template does not answer (it is gone)."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.socket_path)
            conn.sendall(json.dumps(request).encode() + b"\n")
            lines = Lines(conn.fileno())
            answer = lines.readline(PID_TIMEOUT_S) or ""  # nothing in time, or the template gone: not JSON
            return ForkedProcess(conn, lines, int(json.loads(answer)["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            conn.close()
            return None

    def close(self) -> None:
        """The template's group (its children die with it: their parent-death signal) and its socket."""
        killpg(self.proc.pid)
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass
class Templates:
    """The run's templates (shared by its slots' threads), a `ProcessStart`: `command SOCKET STATUS_FD EMULATION`
    starts one (harness/cell/template_server.py); `say` tells the run's output that a key's processes fall back."""

    command: tuple[str, ...]
    log_dir: Path
    say: Callable[[str], None] = print
    fallback: Exec = field(default_factory=Exec)
    _templates: dict[ShareKey, _Template | None] = field(default_factory=dict, init=False)  # None: fell back
    _key_locks: dict[ShareKey, threading.Lock] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def cell(self, command: tuple[str, ...], files: CellFiles, env: dict[str, str], share_key: ShareKey,
             processes: CellProcesses, gpu: int | None) -> Started:
        request = {"kind": "cell", "spec": str(files.spec), "result": str(files.result), "log": str(files.log)}
        child = self._fork(request, env, share_key, processes, gpu)
        if child is None:
            return self.fallback.cell(command, files, env, share_key, processes, gpu)
        return Started(child, "fork", parent_lost=lambda: child.template_lost)

    def worker(self, command: tuple[str, ...], log: Path, env: dict[str, str], share_key: ShareKey,
               processes: CellProcesses, gpu: int | None) -> Started:
        child = self._fork({"kind": "worker", "log": str(log)}, env, share_key, processes, gpu)
        if child is None:
            return self.fallback.worker(command, log, env, share_key, processes, gpu)
        return Started(child, "fork", child.requests, child, lambda: child.template_lost)

    def close(self) -> None:
        with self._lock:
            templates, self._templates = [t for t in self._templates.values() if t is not None], {}
        for template in templates:
            template.close()

    def _fork(self, request: dict[str, Any], env: dict[str, str], share_key: ShareKey, processes: CellProcesses,
              gpu: int | None) -> ForkedProcess | None:
        key = template_key(share_key)
        template = self._template(key, env, processes)
        child = template.fork({**request, "env": env}) if template is not None else None
        if template is not None and child is None:
            self._lost(key, template, "stopped answering")
        if child is not None:
            processes.add(child.pid, gpu)
        return child

    def _template(self, key: ShareKey, env: dict[str, str], processes: CellProcesses) -> _Template | None:
        """The key's template, started on its first use (one start at a time per key); None: its processes
        start by Exec."""
        with self._lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._templates:
                self._templates[key] = self._start(key, env, processes)
            template = self._templates[key]
            if template is not None and (code := template.proc.poll()) is not None:
                self._lost(key, template, f"ended (exit status {code})")
                return None
            return template

    def _start(self, key: ShareKey, env: dict[str, str], processes: CellProcesses) -> _Template | None:
        """A template for the key, once it says it is ready; None where it is not. While it imports (~30 s on a
        2-core CPU) it is one of the run's processes, so that an interrupted run kills it at once instead of waiting
        for its imports."""
        # AF_UNIX paths are capped at 107 bytes, which a run folder's path can pass: the socket gets a short one.
        folder = Path(tempfile.mkdtemp(prefix=f"{SOCKET_FOLDER_PREFIX}{os.getpid()}-"))
        emulation = {"capability": list(key.capability) or None, "cpu_isa": key.cpu_isa}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"template-{len(self._templates)}-{os.getpid()}.log"
        read_end, write_end = os.pipe()
        with log.open("ab") as out:
            proc = popen_own_group([*self.command, str(folder / "socket"), str(write_end), json.dumps(emulation)],
                                   out, env, stdin=subprocess.DEVNULL, pass_fds=(write_end,))
        os.close(write_end)
        processes.add(proc.pid)
        status = Lines(read_end)
        try:
            line = status.readline(READY_TIMEOUT_S)
        finally:
            status.close()
            processes.discard(proc.pid)
        answer = json.loads(line) if line else {}
        template = _Template(proc, folder)
        if processes.stopping:  # killed as the run stops: nothing to say
            template.close()
            return None
        if not answer.get("ready"):
            why = answer.get("refused") or ("did not start in time" if line is None else "ended before it was ready")
            template.close()
            self.say(f"kvmatrix: the template process {proc.pid} ({log}) {why}: cells of its kind start as "
                     "processes of their own")
            return None
        return template

    def _lost(self, key: ShareKey, template: _Template, why: str) -> None:
        with self._lock:
            if self._templates.get(key) is not template:
                return  # already said
            self._templates[key] = None
        template.close()
        self.say(f"kvmatrix: the template process {template.proc.pid} {why}: cells of its kind start as processes "
                 "of their own from now on")
