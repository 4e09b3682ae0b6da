"""Warm-worker records from the real H200 (vLLM 0.26.0, tests/fixtures/records/h200-warm-vllm-0.26.0/): the
same cells run one process per cell and in a warm worker resolved the same state and tokens; a worker's failed
attempt is kept beside the fresh process's record and shows in the reports; a worker that held GPU memory after
teardown retired; the records fit the record model and judge alike today."""

from __future__ import annotations

import json

import pytest

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.record.neighbours import Neighbours
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import check_judged
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import load_cases, load_models, load_pool
from kvmatrix.reports import junit, markdown
from tests.conftest import FIXTURES
from tests.isolation import isolation_differences

FOLDER = FIXTURES / "records" / "h200-warm-vllm-0.26.0"
WORKER = {p.stem: json.loads(p.read_text()) for p in sorted(FOLDER.glob("*.json"))}
PROCESS = {p.stem: json.loads(p.read_text()) for p in sorted((FOLDER / "process").glob("*.json"))}


def test_worker_and_process_records_of_the_same_cells_are_identical():
    worker = [WORKER[name] for name in PROCESS]
    assert len(worker) == 6 and {r["isolation"] for r in worker} == {"worker"}
    assert {r["isolation"] for r in PROCESS.values()} == {"process"}
    assert isolation_differences(list(PROCESS.values()), worker) == []
    assert sum(bool(r["tokens"] and r["layers"]) for r in worker) == 5  # the sixth: fp8_e5m2 refused, as expected
    # One worker ran them all; after its first cell, no import and a warm engine start.
    assert len({r["worker"]["pid"] for r in worker}) == 1
    warm = [r for r in worker if r["worker"]["cells_before"] > 0]
    assert warm and all(r["timings"]["import_s"] == 0 for r in warm)


def test_a_known_failure_seen_in_a_worker_is_the_fresh_process_record():
    record = WORKER["H200--deepseek-mla[kv=fp8,skip=0,spec=-]"]
    assert record["isolation"] == "process" and record["signature"] == "no_common_block_size"
    warm = record["warm_attempt"]
    assert warm["signature"] == record["signature"] and warm["worker"]["cells_before"] == 2
    text = markdown.render([record])
    assert "## Run again in a fresh process" in text and "same in a fresh process" in text
    assert "run again in a fresh process" in junit.render([record])


def test_a_worker_holding_gpu_memory_after_teardown_retired():
    # Captured when a worker retired above 512 MiB kept (now: 7 GiB, harness/vllm_compat/teardown.py).
    for name in ("H200--flashinfer-qdtype[kv=fp8,skip=-,spec=-,attn=FLASHINFER]",
                 "H200--deepseek-v32-sparse-mla[kv=fp8_ds_mla,skip=-,spec=-]"):
        worker = WORKER[name]["worker"]
        assert worker["gpu_memory_left_mib"] > 512 and "still reserved after teardown" in worker["retired"]
        assert WORKER[name]["verdict"] == "pass", "retiring changes the worker, not the cell's verdict"


@pytest.mark.parametrize("name", sorted(WORKER))
def test_records_fit_the_model_and_judge_alike_today(name, tmp_path):
    record = check_judged(WORKER[name], name)
    pool = load_pool()
    cells = {c.cell_id: c for c in expand_all(load_cases(), load_models(), pool)}
    task = Task(cells[record["cell_id"]], "H200", pool["H200"])
    judged = judge_record(record, task, Neighbours(), waivers=[])
    assert judged["verdict"] in ("pass", "fail") and (judged["verdict"] == "pass") == (record["verdict"] == "pass")
