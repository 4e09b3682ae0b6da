"""benchmarks/gpu_matrix_call.py, the GPU matrix benchmark's reading of the harness, on the H200's cold vLLM 0.34.0
run (tests/fixtures/runs/h200-vllm-0.34.0-2026-12-04.tar.xz): the class a driver name is, the start order a cold run
borrows, and the summary line's verdict comparison."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvmatrix.harness.run.last_run import last_run_file, recall
from tests.conftest import FIXTURES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from gpu_matrix_call import gpu_class, reference, seed, summary  # noqa: E402

MATRIX = FIXTURES / "runs" / "h200-vllm-0.34.0-2026-12-04.tar.xz"


@pytest.fixture(scope="module")
def before(tmp_path_factory) -> Path:
    return reference(f"{MATRIX}:cold", tmp_path_factory.mktemp("reference") / "before")


def test_the_class_is_the_pools_for_the_drivers_name():
    assert gpu_class("NVIDIA H100 80GB HBM3") == "H100"
    assert gpu_class("NVIDIA H200\n") == "H200"
    with pytest.raises(SystemExit, match="Tesla T4"):
        gpu_class("Tesla T4")


def test_a_cold_run_borrows_the_references_walls_verdicts_and_backends(before, tmp_path, monkeypatch):
    monkeypatch.setattr("gpu_matrix_call.installed_vllm_version", lambda: "0.34.0")
    seed(before, tmp_path, "H100")
    seconds, verdicts, backends = recall(last_run_file(tmp_path, "H100", "0.34.0"))
    assert len(seconds) == len(verdicts) == 204  # every cell the reference ran; its 28 skips say nothing
    assert seconds["flashinfer-qdtype[kv=fp8,skip=0,spec=-,attn=FLASHINFER,exec=eager]"] > 270
    # Judged under today's waivers: the 27 cells that failed then are known failures, or the MTP numerics now told
    # apart (tests/test_gpu_records_0_34.py).
    assert "fail" not in verdicts.values() and list(verdicts.values()).count("xfail") == 38
    # vLLM's own pick where no backend was forced: the kernel families of a cold run that has none yet.
    assert backends["fp8-every-backend[kv=fp8,skip=-,spec=-,attn=-,exec=eager]"] == "FLASH_ATTN"


def test_the_summary_says_whether_every_shared_cell_got_the_references_verdict(before, tmp_path):
    line = summary(before, before, 480, [400.0, 120.0])
    assert "204 of 232 cells run" in line and "wall 520 s in 2 call(s) (400+120)" in line
    assert "goal 480 s NOT met" in line and "fail 0" in line
    assert line.endswith("identical to the reference's: yes (232 cells in both, 0 differ)")
