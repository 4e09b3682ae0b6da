"""Real cells for the tests that read one cell's output (tests/test_cell.py, tests/test_forced_decode.py), run in a
warm worker (`python -m kvmatrix.harness.cell.worker`: a CPU run's own isolation, each cell run exactly as `python -m
kvmatrix.harness.cell` runs it) kept for the test session (tests/conftest.py `cell_workers`): its cells share one
import of torch and vLLM (~7 CPU-s on 2 cores) instead of paying it each. The workers are the runs' own launcher
(harness/run/process/launch.py `WarmWorker`), one per emulated CPU level, since vLLM reads the CPU's level when it is
imported. tests/test_isolation_equality.py shows a warm worker's cells resolve as fresh processes' do."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from kvmatrix.harness.run.process.groups import CellProcesses
from kvmatrix.harness.run.process.launch import WarmWorker
from kvmatrix.harness.run.process.start import CellFiles, ShareKey

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600.0  # a cell of these tests takes ~15 s on 2 cores


class CellWorkers:
    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.processes = env, CellProcesses()
        self.workers = WarmWorker((sys.executable, "-m", "kvmatrix.harness.cell.worker"), log_dir)

    def run(self, spec: dict, folder: Path) -> tuple[int, dict, str]:
        """(the cell's exit code, its RESULT.json, its log) of `spec` run in the worker of its emulation."""
        files = CellFiles(folder / "spec.json", folder / "result.json", folder / "cell.log")
        files.spec.write_text(json.dumps(spec))
        launched = self.workers.launch(files, self.env, ShareKey((), (), spec.get("emulate_cpu_isa")), TIMEOUT_S,
                                       self.processes, None)
        log = files.log.read_text(errors="replace")
        assert not launched.timed_out, f"no reply in {TIMEOUT_S:.0f} s: {log[-3000:]}"
        return launched.returncode, json.loads(files.result.read_text()), log

    def close(self) -> None:
        self.workers.close()


def cell_env() -> dict[str, str]:
    """This environment for a cell, kvmatrix importable; an empty VLLM_CPU_KVCACHE_SPACE (which vLLM refuses) left
    out."""
    env = {k: v for k, v in os.environ.items() if not (k == "VLLM_CPU_KVCACHE_SPACE" and v == "")}
    return {**env, "PYTHONPATH": str(REPO)}
