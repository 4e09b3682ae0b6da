"""A warm worker: one process that imports torch and vLLM once and runs cells one after another.

    python -m kvmatrix.harness.cell.worker REPLY_FD

The runner (harness/run/process/launch.py) writes one JSON line per cell on stdin: {"spec": ..., "result": ..., "log":
...}. For each, the worker points its stdout and stderr (the file descriptors, so vLLM's C++ output follows) at the
cell's log, runs the cell exactly as `python -m kvmatrix.harness.cell` would (main.py: same phases, same
RESULT.json), tears the engine down and answers one JSON line on REPLY_FD: {"code": the cell's exit code,
"teardown_s": ..., "gpu_memory_left_mib": what torch still reserves, "retire": why this worker must not run
another cell, or null}.
A Python exception is the cell's record and the worker goes on; a CUDA error or more memory kept after
teardown than harness/vllm_compat/teardown.py allows retires it (the runner starts a fresh one). Anything harder
(a segfault, a kill, a hang) ends the process itself, and the runner sees that instead of a reply.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kvmatrix.harness.record.files import read_result
from kvmatrix.harness.vllm_compat import IN_PROCESS_ENGINE_ENV, gpu_memory_left_mib, retire_reason, teardown_engine

RunOne = Callable[[str, str], int]


def serve(run_one: RunOne, reply_fd: int, after_cell: Callable[[str], str | None],
          memory_left: Callable[[], float] = lambda: 0.0) -> None:
    """Run each requested cell with `run_one(spec, result)`, answer on `reply_fd`; `after_cell(result)` cleans up
    and says why the worker must retire (None: it goes on). Ends at stdin's end or after a retiring cell."""
    reply = os.fdopen(reply_fd, "w", buffering=1)
    home_out, home_err = os.dup(1), os.dup(2)  # the worker's own log, between cells
    for line in sys.stdin:
        request = json.loads(line)
        with _output_to(Path(request["log"]), home_out, home_err):
            code = run_one(request["spec"], request["result"])
            started = time.monotonic()
            retire = after_cell(request["result"])
        reply.write(json.dumps({"code": code, "teardown_s": round(time.monotonic() - started, 3),
                                "gpu_memory_left_mib": round(memory_left(), 1), "retire": retire}) + "\n")
        if retire:
            return


class _output_to:
    """stdout and stderr (Python's and the file descriptors) into `log` for one cell, then back."""

    def __init__(self, log: Path, home_out: int, home_err: int) -> None:
        self.log, self.home = log, (home_out, home_err)

    def __enter__(self) -> None:
        _flush()
        self.file = self.log.open("ab")
        os.dup2(self.file.fileno(), 1)
        os.dup2(self.file.fileno(), 2)

    def __exit__(self, *exc: object) -> None:
        _flush()
        os.dup2(self.home[0], 1)
        os.dup2(self.home[1], 2)
        self.file.close()


def _flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


def after_vllm_cell(result_path: str) -> str | None:
    """Free what the cell's engine held (the engine itself was dropped with main()'s frame; the teardown unfreezes
    what vLLM froze out of the collector and collects it) and say whether this process may run another cell."""
    teardown_engine()
    return retire_reason(read_result(result_path))


def serve_vllm_cells(reply_fd: int) -> None:
    """The worker loop over real cells (main.py), in a process of its own or forked from a template
    (harness/cell/template_server.py)."""
    from kvmatrix.harness.cell.main import main as cell_main

    os.environ.update(IN_PROCESS_ENGINE_ENV)
    serve(cell_main, reply_fd, after_vllm_cell, gpu_memory_left_mib)


def main() -> None:
    serve_vllm_cells(int(sys.argv[1]))
    _flush()
    os._exit(0)  # as a cell process does: vLLM's shutdown hooks must not turn a clean end into a hang


if __name__ == "__main__":
    main()
