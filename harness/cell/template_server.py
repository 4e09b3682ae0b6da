"""A template: one process that imports torch and vLLM (and what a first engine imports lazily) once, then forks
cell processes and warm workers that start with all of it imported.

    python -m kvmatrix.harness.cell.template_server SOCKET STATUS_FD EMULATION_JSON

Started by the runner (harness/run/process/template_client.py) with the environment of the cells it will fork, it
applies their emulation before the imports as a cell process does (vllm_import.py `import_vllm`), checks that it may
fork and answers one JSON line on STATUS_FD: {"ready": true} once it listens on the Unix socket SOCKET, or {"refused":
why} before it exits (an import failed, another Python thread is alive, CUDA is initialised: a forked child of such a
process can hang on a lock another thread held, or find its CUDA context unusable).

Each connection is one launch. The runner sends one JSON line: {"kind": "cell", "spec", "result", "log", "env"}
or {"kind": "worker", "log", "env"}; the template forks, answers {"pid": N} and keeps the connection until it reaps
the child, then writes {"exit": the status as subprocess.Popen reports it (minus the signal number for a signal)}
and closes it. A worker child serves its cells on that same connection (harness/cell/worker.py: the requests in,
its replies out), so the runner tells a worker's reply from the template's {"exit": ...} by its key.

The child becomes what `python -m kvmatrix.harness.cell` (or the worker) would be: its own session (the runner
kills its process group), killed when the template dies, the template's sockets closed, its output into the cell's
log (fresh) or the worker's log, the request's environment (harness/vllm_compat/preimport.py: what it may still
change after the imports), then the cell or the worker loop and os._exit. Its cell records what a fresh process
records; only its import phase takes no time.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from kvmatrix.harness.cell.process_group import die_with_parent, killpg

REAP_INTERVAL_S = 0.1  # how soon a child's end reaches the runner
REQUEST_TIMEOUT_S = 30.0  # for the one request line of a connection

RunCell = Callable[[str, str], int]  # (spec, result) -> exit code
ServeWorker = Callable[[int], None]  # the reply fd; requests on stdin


def fork_unsafe() -> str | None:
    """Why this process must not fork cells (None: it may). Python threads other than this one may hold locks
    (logging's, the import lock) that the child would wait on forever; a child of a process with CUDA initialised
    cannot use CUDA. The native threads that libraries keep idle (torch's and vLLM's imports leave a few, e.g.
    jemalloc's background thread) are not Python's and fork as vLLM's own CPU forking of engines does."""
    if threading.active_count() > 1:
        return f"{threading.active_count()} Python threads alive: {[t.name for t in threading.enumerate()]}"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in the template"
    return None


def serve_forks(listener: socket.socket, run_cell: RunCell, serve_worker: ServeWorker) -> None:
    """Fork a child per connection and report its end on it, for ever (the runner kills the template)."""
    children: dict[int, socket.socket] = {}
    while True:
        ready, _, _ = select.select([listener], [], [], REAP_INTERVAL_S)
        if ready:
            _launch(listener, children, run_cell, serve_worker)
        _reap(children)


def _launch(listener: socket.socket, children: dict[int, socket.socket], run_cell: RunCell,
            serve_worker: ServeWorker) -> None:
    conn, _ = listener.accept()
    try:
        request = json.loads(_read_line(conn))
    except (OSError, ValueError):
        conn.close()  # a runner that went away before it asked: nothing to fork
        return
    template = os.getpid()
    pid = os.fork()
    if pid == 0:
        _child(request, conn, template, [listener, *children.values()], run_cell, serve_worker)
    children[pid] = conn
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:  # the runner is gone: the child is reaped and reported to nobody
        pass


def _read_line(conn: socket.socket) -> bytes:
    """The request, byte by byte: whatever follows it (a worker's first cell) is the child's to read."""
    conn.settimeout(REQUEST_TIMEOUT_S)
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = conn.recv(1)
        if not byte:
            raise OSError("connection closed before the request's end")
        line += byte
    conn.settimeout(None)
    return bytes(line)


def _reap(children: dict[int, socket.socket]) -> None:
    """Report each child that ended. Its process group goes with it, as the runner's killpg takes a fresh process's
    helpers: killed while the child is a zombie, so its pid (the group's id) cannot have been reused."""
    while children:
        try:
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if ended is None:
            return
        killpg(ended.si_pid)
        _, status = os.waitpid(ended.si_pid, 0)
        conn = children.pop(ended.si_pid, None)
        if conn is None:  # not a launch's child (cannot happen: every fork is one)
            continue
        try:
            conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
        except OSError:
            pass
        conn.close()


def _child(request: dict[str, Any], conn: socket.socket, template: int, template_sockets: list[socket.socket],
           run_cell: RunCell, serve_worker: ServeWorker) -> None:
    """Become the requested cell process or worker; never returns."""
    code = 1
    try:
        os.setsid()
        die_with_parent(template)()
        for sock in template_sockets:
            sock.close()
        _become(request["env"])
        if request["kind"] == "worker":
            code = _run_worker(request, conn, serve_worker)
        else:
            conn.close()
            code = _run_cell(request, run_cell)
    except BaseException:  # noqa: BLE001  whatever it was, the child must not return into the template's loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _become(env: dict[str, str]) -> None:
    """The request's environment in place of the template's. Only what preimport.py lists differs from the
    template's (the runner forks a cell only from a template of its other variables); OpenMP took its thread count
    when torch loaded, so it is set again."""
    os.environ.clear()
    os.environ.update(env)
    torch = sys.modules.get("torch")
    if torch is not None and env.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))


def _output_to(path: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | mode, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _run_cell(request: dict[str, Any], run_cell: RunCell) -> int:
    """As `python -m kvmatrix.harness.cell SPEC RESULT` with its output into the fresh log and no stdin."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    _output_to(request["log"], os.O_TRUNC)
    return run_cell(request["spec"], request["result"])


def _run_worker(request: dict[str, Any], conn: socket.socket, serve_worker: ServeWorker) -> int:
    """As `python -m kvmatrix.harness.cell.worker REPLY_FD`, the connection both its stdin and its reply fd."""
    os.dup2(conn.fileno(), 0)
    reply_fd = os.dup(conn.fileno())
    conn.close()
    _output_to(request["log"], os.O_APPEND)
    serve_worker(reply_fd)
    return 0


def run_template(prepare: Callable[[dict[str, Any]], None], run_cell: RunCell, serve_worker: ServeWorker) -> None:
    """The template's life: `prepare(emulation)` imports what the cells need; then ready (or refused) on the
    status fd, and forks until killed."""
    socket_path, status_fd, emulation = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    status = os.fdopen(status_fd, "w", buffering=1)
    try:
        prepare(emulation)
        refused = fork_unsafe()
    except BaseException as exc:  # noqa: BLE001  the cells then start as processes of their own and record it
        traceback.print_exc()
        refused = f"the imports failed: {type(exc).__name__}: {exc}"
    if refused:
        status.write(json.dumps({"refused": refused}) + "\n")
        status.close()
        os._exit(1)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen()
    status.write(json.dumps({"ready": True}) + "\n")
    status.close()
    serve_forks(listener, run_cell, serve_worker)


def _import_for_cells(emulation: dict[str, Any]) -> None:
    from kvmatrix.harness import vllm_compat
    from kvmatrix.harness.cell.vllm_import import preimport_vllm

    version = vllm_compat.installed_vllm_version()
    preimport_vllm(emulation.get("capability"), emulation.get("cpu_isa"), version)
    for modules in vllm_compat.for_version(vllm_compat.ENGINE_MODULES, version):
        for module in modules:
            importlib.import_module(module)


def main() -> None:
    from kvmatrix.harness.cell.main import main as cell_main
    from kvmatrix.harness.cell.worker import serve_vllm_cells
    from kvmatrix.harness.vllm_compat import IN_PROCESS_ENGINE_ENV

    os.environ.update(IN_PROCESS_ENGINE_ENV)
    run_template(_import_for_cells, cell_main, serve_vllm_cells)


if __name__ == "__main__":
    main()
