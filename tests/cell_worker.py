"""Real cells for the tests that read one cell's output (tests/test_cell.py, tests/test_forced_decode.py), run in a
warm worker (`python -m kvmatrix.harness.cell.worker`: a CPU run's own isolation, each cell run exactly as `python -m
kvmatrix.harness.cell` runs it) kept for the test session (tests/conftest.py `cell_workers`): its cells share one
import of torch and vLLM (~7 CPU-s on 2 cores) instead of paying it each. One worker per emulated CPU level, since
vLLM reads the CPU's level when it is imported. tests/test_isolation_equality.py shows a warm worker's cells resolve
as fresh processes' do."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600.0  # a cell of these tests takes ~15 s on 2 cores


class CellWorkers:
    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.log_dir = env, log_dir
        self.workers: dict[str | None, tuple[subprocess.Popen, IO[str]]] = {}

    def run(self, spec: dict, folder: Path) -> tuple[int, dict, str]:
        """(the cell's exit code, its RESULT.json, its log) of `spec` run in the worker of its emulation."""
        spec_path, result_path, log = folder / "spec.json", folder / "result.json", folder / "cell.log"
        spec_path.write_text(json.dumps(spec))
        emulate = spec.get("emulate_cpu_isa")
        worker, replies = self._worker(emulate)
        assert worker.stdin is not None
        worker.stdin.write(json.dumps({"spec": str(spec_path), "result": str(result_path), "log": str(log)}) + "\n")
        worker.stdin.flush()
        if not select.select([replies], [], [], TIMEOUT_S)[0]:
            worker.kill()
            self._close(emulate)
            raise TimeoutError(f"no reply in {TIMEOUT_S:.0f} s: {log.read_text(errors='replace')[-3000:]}")
        reply = replies.readline()
        if not reply:  # the process ended (a signal): what a cell process of its own would have exited with
            self._close(emulate)
            code = worker.returncode
        else:
            answer = json.loads(reply)
            code = answer["code"]
            if answer["retire"]:
                self._close(emulate)
        return code, json.loads(result_path.read_text()), log.read_text(errors="replace")

    def _worker(self, emulate: str | None) -> tuple[subprocess.Popen, IO[str]]:
        if emulate not in self.workers:
            read, write = os.pipe()
            with (self.log_dir / f"worker-{emulate}.log").open("a") as own_log:
                worker = subprocess.Popen([sys.executable, "-m", "kvmatrix.harness.cell.worker", str(write)], cwd=REPO,
                                          env=self.env, stdin=subprocess.PIPE, stdout=own_log,
                                          stderr=subprocess.STDOUT, pass_fds=(write,), text=True)
            os.close(write)
            self.workers[emulate] = (worker, os.fdopen(read))
        return self.workers[emulate]

    def _close(self, emulate: str | None) -> None:
        worker, replies = self.workers.pop(emulate)
        assert worker.stdin is not None
        worker.stdin.close()
        worker.wait(timeout=120)
        replies.close()

    def close(self) -> None:
        for emulate in list(self.workers):
            self._close(emulate)


def cell_env() -> dict[str, str]:
    """This environment for a cell, kvmatrix importable; an empty VLLM_CPU_KVCACHE_SPACE (which vLLM refuses) left
    out."""
    env = {k: v for k, v in os.environ.items() if not (k == "VLLM_CPU_KVCACHE_SPACE" and v == "")}
    return {**env, "PYTHONPATH": str(REPO)}
