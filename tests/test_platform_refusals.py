"""A platform's clear refusal of a quantized KV dtype is never a FAIL, also in a user's case that does not expect
it; the same words are vLLM's fault on a class that can run it, and where the cell asked for no quantized dtype.
Judged from a real record of a user's own case on an AVX2-only CPU (fixtures/user-case-cpu-avx2-*)."""

from __future__ import annotations

import json

import pytest

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.record.neighbours import Neighbours
from kvmatrix.harness.record.task import Task
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import load_cases, load_models
from tests.conftest import FIXTURES, shipped_matrix

# Not under records/: its case is no default case, which the tests over records/ judge them by.
RECORDS = FIXTURES / "user-case-cpu-avx2-vllm-0.32.0"
REFUSED = RECORDS / "cpu-avx2--my-wrong-guess[kv=fp8,skip=-,spec=-].json"
REFUSAL = "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."


def user_cells() -> dict:
    pool, _, _ = shipped_matrix()
    return {c.cell_id: c for c in expand_all(load_cases([RECORDS / "my-wrong-guess.yaml"]), load_models(), pool)}


def judged(cell_id: str, gpu: str, tmp_path) -> dict:
    pool, _, waivers = shipped_matrix()
    record = json.loads(REFUSED.read_text())
    return judge_record(record, Task(user_cells()[cell_id], gpu, pool[gpu]), Neighbours(), waivers)


@pytest.mark.parametrize("gpu", ["cpu-avx2", "cpu-arm64"])
def test_a_class_that_cannot_run_fp8_kv_refusing_it_skips_a_users_cell(gpu, tmp_path):
    record = judged("my-wrong-guess[kv=fp8,skip=-,spec=-]", gpu, tmp_path)
    assert (record["verdict"], record["reason"]) == ("skip", f"{gpu} cannot run this, as vLLM says at start: {REFUSAL}")


@pytest.mark.parametrize("cell_id, gpu", [
    ("my-wrong-guess[kv=fp8,skip=-,spec=-]", "cpu-avx512"),  # its kernels are there: the CPU was misread
    ("my-wrong-guess[kv=bfloat16,skip=-,spec=-]", "cpu-avx2"),  # an explicit bfloat16 run as fp8 (seed A)
])
def test_the_same_refusal_fails_where_it_is_vllms_fault(cell_id, gpu, tmp_path):
    record = judged(cell_id, gpu, tmp_path)
    assert (record["verdict"], record["reason"]) == ("fail", f"crash [cpu_fp8_kv_needs_avx512] {REFUSAL}")


def test_a_case_that_expects_the_refusal_still_passes_it(tmp_path):
    pool, cells, waivers = shipped_matrix()
    record = json.loads(REFUSED.read_text())
    task = Task(cells["llama-skip[kv=fp8,skip=-,spec=-]"], "cpu-avx2", pool["cpu-avx2"])
    record = judge_record(record, task, Neighbours(), waivers)
    assert (record["verdict"], record["reason"]) == ("pass", f"refused as expected: cpu_fp8_kv_needs_avx512: {REFUSAL}")
