"""Kernel faults are named (harness/vllm_compat/signatures.py): an illegal memory access, a failed launch, logits
that are not numbers, on the error texts vLLM and torch print (from public vLLM / PyTorch issues, cited), through
the same path a crashed cell's record takes (harness/judge/outcome.py), so a graphs-only decode fault reads
`crashes under graphs/plain only (cuda_illegal_memory_access)` rather than an anonymous fingerprint."""

from __future__ import annotations

import pytest

from kvmatrix.harness.judge.outcome import classify_outcome
from kvmatrix.harness.judge.signatures import classify
from kvmatrix.harness.vllm_compat import signature_matches

# vllm-project/vllm#45670 (CUDA graphs, H200-class GPU): the engine core's error, then the API server's wrapper.
ILLEGAL_ACCESS_LOG = (
    "(EngineCore pid=1426191) torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
    "(EngineCore pid=1426191) Search for `cudaErrorIllegalAddress' in "
    "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.\n"
    "(EngineCore pid=1426191) Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
    "root cause.\n")
# vllm-project/vllm#6976 (an older release's words): RuntimeError instead of torch.AcceleratorError.
ILLEGAL_ACCESS_OLD = ("RuntimeError: CUDA error: an illegal memory access was encountered\n"
                      "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                      "below might be incorrect.")
# A graph replay racing an in-place copy (SNU-ARC/DecDEC#1), and torch's allocator (pytorch/pytorch#49832).
LAUNCH_FAILURE = "torch.AcceleratorError: CUDA error: unspecified launch failure"
LAUNCH_FAILURE_ALLOCATOR = ("terminate called after throwing an instance of 'c10::Error'\n  what():  CUDA error: "
                            "unspecified launch failure (insert_events at "
                            "/pytorch/c10/cuda/CUDACachingAllocator.cpp:764)")
LAUNCH_FAILURE_RUNTIME = "cudaErrorLaunchFailure: unspecified launch failure"  # huggingface/accelerate#83
# vLLM's own check (vllm/v1/worker/utils.py raise_if_nan_logits, VLLM_RAISE_ON_LOGIT_NANS=1), and torch's sampler
# under random sampling (vllm-project/vllm#4151, #1952: NaNs out of an attention kernel).
NAN_LOGITS = "RuntimeError: NaNs detected in logits: {'0-8c1d': 320}"
NAN_PROBABILITIES = "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0"


@pytest.mark.parametrize(("text", "signature"), [
    (ILLEGAL_ACCESS_LOG, "cuda_illegal_memory_access"),
    (ILLEGAL_ACCESS_OLD, "cuda_illegal_memory_access"),
    (LAUNCH_FAILURE, "cuda_launch_failure"),
    (LAUNCH_FAILURE_ALLOCATOR, "cuda_launch_failure"),
    (LAUNCH_FAILURE_RUNTIME, "cuda_launch_failure"),
    (NAN_LOGITS, "nan_inf_logits"),
    (NAN_PROBABILITIES, "nan_inf_logits"),
])
def test_kernel_faults_are_named(text: str, signature: str) -> None:
    for version in ("0.33.0", "0.32.0", None):
        assert classify(text, version) == signature
    assert signature_matches("kernel_fault", signature)


def test_a_crashed_cell_names_its_kernel_fault_not_its_wrapper() -> None:
    """A decode step's fault as the cell process records it (the exception, then the log's tail with vLLM's
    EngineDeadError wrapper): the record's signature is the fault's, its error line the exception's."""
    result = {"cell_id": "c", "status": "crash", "phase": "generate", "vllm_version": "0.33.0",
              "exception": {"type": "AcceleratorError", "message": "CUDA error: an illegal memory access was "
                            "encountered", "traceback_tail": ""}}
    outcome = classify_outcome(1, False, 600, result, ILLEGAL_ACCESS_LOG)
    assert outcome["status"] == "crash"
    assert outcome["signature"] == "cuda_illegal_memory_access"
    assert outcome["error_tail"] == "AcceleratorError: CUDA error: an illegal memory access was encountered"


def test_other_failures_keep_their_names() -> None:
    """The new names take nothing from the existing ones: out of memory stays out of memory."""
    assert classify("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "0.33.0") == \
        "out_of_memory"
    assert classify("ValueError: No common block size for 32.", "0.33.0") == "no_common_block_size"
