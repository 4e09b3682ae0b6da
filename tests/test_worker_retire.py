"""When a warm worker retires for the GPU memory it kept after teardown (harness/vllm_compat/teardown.py), judged on
what the H200's cold vLLM 0.34.0 run's workers kept (tests/fixtures/runs/h200-vllm-0.34.0-2026-12-04.tar.xz)."""

from __future__ import annotations

import pytest

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.vllm_compat import teardown
from tests.conftest import FIXTURES, unpacked_archive

MATRIX = FIXTURES / "runs" / "h200-vllm-0.34.0-2026-12-04.tar.xz"


@pytest.fixture(scope="module")
def kept_mib(tmp_path_factory) -> dict[str, float]:
    """Cell id -> the MiB its worker still reserved after its teardown."""
    records = RunDir(unpacked_archive(tmp_path_factory, MATRIX) / "cold").records()
    return {r["cell_id"]: r["worker"]["gpu_memory_left_mib"] for r in records
            if (r.get("worker") or {}).get("gpu_memory_left_mib") is not None}


def retires_at(monkeypatch, mib: float) -> str | None:
    monkeypatch.setattr(teardown, "gpu_memory_left_mib", lambda: mib)
    return teardown.retire_reason({"engine_args": {}, "exception": None})


def test_a_worker_after_glm5_fp8s_fp8_cells_goes_on(kept_mib, monkeypatch):
    """Those cells keep 6.0-6.1 GiB (the run retired three workers for it, each replaced at 40-50 s): the worker
    keeps its slot; every cell of the run kept less."""
    glm5 = {cell: mib for cell, mib in kept_mib.items() if cell.startswith("glm5-fp8[kv=fp8")}
    assert max(glm5.values()) > 6000
    for mib in kept_mib.values():
        assert retires_at(monkeypatch, mib) is None


def test_a_worker_keeping_more_than_the_cap_retires(monkeypatch):
    reason = retires_at(monkeypatch, teardown.MEMORY_KEPT_CAP_MIB + 1)
    assert reason is not None and "still reserved after teardown" in reason
