"""How a cell process or a warm worker starts, behind one `ProcessStart` protocol the launchers (launch.py) use:
`Exec` runs its command, a new interpreter in a process group (a session) of its own that dies with the harness;
a run's templates (template.py) fork the same process from one that imported torch and vLLM already. Either way
the launcher gets a `Started`: the process as far as it uses subprocess.Popen (pid, returncode, wait), a worker's
request and reply streams, and how it started.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from kvmatrix.harness.record.parts import ProcessStartedBy
from kvmatrix.harness.record.paths import CELL_CWD
from kvmatrix.harness.run.process.groups import CellProcesses, die_with_parent, killpg


class ShareKey(NamedTuple):
    """What is fixed before vLLM's import: cells that differ in it never share a process's imports."""

    env: tuple[tuple[str, str], ...]
    capability: tuple[int, ...]
    cpu_isa: str | None


@dataclass(frozen=True)
class CellFiles:
    spec: Path
    result: Path
    log: Path


class Lines:
    """JSON lines from a pipe or socket, read with a timeout; its own buffer, so a line already read is never
    left waiting behind a select() on the file descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd, self._buffer = fd, b""

    def readline(self, timeout: float | None) -> str | None:
        """The next line; "" at the end of the stream; None when none came within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                line, self._buffer = self._buffer, b""
                return line.decode()
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode() + "\n"

    def close(self) -> None:
        os.close(self.fd)


class Process(Protocol):
    """What the launchers use of a started process (subprocess.Popen's names): a forked one has them too."""

    pid: int
    returncode: Any

    def wait(self, timeout: float | None = None) -> int: ...


class Requests(Protocol):
    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class Replies(Protocol):
    def readline(self, timeout: float | None) -> str | None: ...

    def close(self) -> None: ...


@dataclass
class Started:
    """A cell or worker process: a worker's requests and replies too, and how it started ("exec" or "fork")."""

    proc: Process
    how: ProcessStartedBy
    requests: Requests | None = None
    replies: Replies | None = None
    # Whether it ended because what it was forked from died (not by anything the cell did): then it runs again.
    parent_lost: Callable[[], bool] = lambda: False


class ProcessStart(Protocol):
    """How a launcher's processes start; each in its own process group that dies with the harness, its output into
    its log, tracked in `processes`."""

    def cell(self, command: tuple[str, ...], files: CellFiles, env: dict[str, str], share_key: ShareKey,
             processes: CellProcesses, gpu: int | None) -> Started:
        """`command SPEC RESULT`, its output into the cell's log (emptied first)."""
        ...

    def worker(self, command: tuple[str, ...], log: Path, env: dict[str, str], share_key: ShareKey,
               processes: CellProcesses, gpu: int | None) -> Started:
        """`command REPLY_FD`: cells as JSON lines on its requests, its answers on its replies."""
        ...

    def close(self) -> None:
        """No process this start keeps for later starts outlives the call."""
        ...


class Exec:
    """Each process runs its command: a new interpreter that imports everything itself."""

    def cell(self, command: tuple[str, ...], files: CellFiles, env: dict[str, str], share_key: ShareKey,
             processes: CellProcesses, gpu: int | None) -> Started:
        with files.log.open("wb") as out:
            return Started(_start([*command, str(files.spec), str(files.result)], out, env, processes, gpu), "exec")

    def worker(self, command: tuple[str, ...], log: Path, env: dict[str, str], share_key: ShareKey,
               processes: CellProcesses, gpu: int | None) -> Started:
        read_end, write_end = os.pipe()
        with log.open("ab") as out:
            proc = _start([*command, str(write_end)], out, env, processes, gpu, stdin=subprocess.PIPE,
                          pass_fds=(write_end,))
        os.close(write_end)
        return Started(proc, "exec", proc.stdin, Lines(read_end))

    def close(self) -> None:
        pass


def _start(command: list[str], out: Any, env: dict[str, str], processes: CellProcesses, gpu: int | None,
           **popen: Any) -> subprocess.Popen:
    """A cell or worker process in its own group, dying with the harness, its output into `out`."""
    proc = popen_own_group(command, out, env, stdin=popen.pop("stdin", subprocess.DEVNULL), **popen)
    processes.add(proc.pid, gpu)
    return proc


def popen_own_group(command: list[str], out: Any, env: dict[str, str], **popen: Any) -> subprocess.Popen:
    """`command` in a process group (a session) of its own that dies with the harness, its output into `out`."""
    return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=CELL_CWD,
                            start_new_session=True, preexec_fn=die_with_parent(os.getpid()), text=True, **popen)


def end_process(proc: Process, processes: CellProcesses | None) -> None:
    """Kill the process's whole group, reap it and stop tracking it."""
    killpg(proc.pid)
    proc.wait()
    if processes is not None:
        processes.discard(proc.pid)
