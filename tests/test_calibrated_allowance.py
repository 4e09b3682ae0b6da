"""The differential allowance is calibrated data (harness/judge/calibration.yaml, allowances.py), keyed by what
moves numerics, judged on real records of the default matrix on the H200 with vLLM 0.34.0
(tests/fixtures/runs/h200-vllm-0.34.0-2026-12-04.tar.xz): the FP8-weight GLM graphs vs eager (0.00388 typical with
a bf16 cache, the H100's false alarm at the old fixed 0.003) passes for FP8 weights and would fail bf16 weights; a
draft pair is judged by its distance under the same context, never by a fixed 0.1 logprob tolerance."""

from __future__ import annotations

import copy
import json

import pytest

from kvmatrix.harness.judge.allowances import MARGIN, calibrated, calibration, describe, weights_kind
from kvmatrix.harness.judge.teacher_forced import floor_of, judge_forced, judge_shared_context
from kvmatrix.harness.judge.tokens import compare_tokens
from kvmatrix.matrix.expectations import Differential
from tests.conftest import FIXTURES, unpacked_archive

ARCHIVE = FIXTURES / "runs" / "h200-vllm-0.34.0-2026-12-04.tar.xz"
GLM_FP8_GRAPHS = "glm-fp8[kv=auto,skip=-,spec=-]"
GLM_FP8_EAGER = "glm-fp8[kv=auto,skip=-,spec=-,exec=eager]"
GLM_FP8_MTP = "glm-fp8[kv=bfloat16,skip=-,spec=glm-fp8-mtp,exec=eager]"
GLM_FP8_NO_DRAFT = "glm-fp8[kv=bfloat16,skip=-,spec=-,exec=eager]"
# What vLLM 0.34.0 loads for the tiny FP8 GLM (compressed-tensors W8A8): FP8 linear weights beside bf16 norms and
# embeddings. The records predate the probe's `weight_dtypes`; the tests say what the probe reads now.
FP8_CHECKPOINT_DTYPES = ["bfloat16", "float32", "float8_e4m3fn"]


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, dict]:
    folder = unpacked_archive(tmp_path_factory, ARCHIVE) / "cold"
    out = {}
    for path in folder.glob("H200--*.json"):
        record = json.loads(path.read_text())
        out[record["cell_id"]] = record
    return out


def forced_verdict(record: dict, oracle: dict) -> dict:
    floor, missing = floor_of(oracle["tokens"], oracle["logprobs"], oracle.get("noise_floor"), 0.1)
    reference = {"tokens": oracle["tokens"], "logprobs": oracle["logprobs"]}
    return judge_forced(record["forced"], reference, floor, missing, calibrated(record, "cuda", draft=False), 0.1)


def test_fp8_weights_are_allowed_what_they_measured_and_bf16_weights_are_not(records):
    graphs, eager = records[GLM_FP8_GRAPHS], records[GLM_FP8_EAGER]
    assert "weight_dtypes" not in graphs  # captured before the probe read them
    fp8 = forced_verdict({**graphs, "weight_dtypes": FP8_CHECKPOINT_DTYPES}, eager)
    assert fp8["cell"]["typical"] == pytest.approx(0.00388, abs=5e-5)
    assert fp8["ok"], fp8["detail"]
    assert fp8["rule"]["calibrated"]["weights"] == "fp8" and fp8["rule"]["calibrated"]["calibrated_here"]
    # The same distance from a model with bf16 weights is outside what bf16 weights measured: it fails, naming
    # the allowance and where it was measured.
    bf16 = forced_verdict({**graphs, "weight_dtypes": ["bfloat16"]}, eager)
    assert not bf16["ok"]
    assert "> 0.00324 allowed" in bf16["detail"] and "bf16 weights" in bf16["detail"]
    assert "H200 vLLM 0.33.0" in bf16["detail"]


def test_a_record_that_does_not_say_its_weights_is_allowed_what_fp8_weights_are(records):
    graphs, eager = records[GLM_FP8_GRAPHS], records[GLM_FP8_EAGER]
    verdict = forced_verdict(graphs, eager)
    assert verdict["ok"] and verdict["rule"]["calibrated"]["weights"] == "unknown"
    assert any("does not say its weights' dtype" in note for note in verdict["rule"]["calibrated"]["notes"])
    assert weights_kind(graphs) is None and weights_kind({"weight_dtypes": ["bfloat16"]}) == "bf16"


def test_every_allowance_is_derived_from_the_calibration_data():
    """MARGIN x the largest clean distance measured for the kind on the device kind, never below the plainest
    numerics': a quantized cache on the CPU from the cpu-amx trained Llama, on CUDA from the H100's (its default
    matrix, vLLM 0.34.0), for every CUDA class and release alike."""
    cpu = calibrated({"layers": [{"kv_cache_dtype": "fp8"}], "weight_dtypes": ["bfloat16"], "gpu_class": "cpu-amx",
                      "vllm_version": "0.32.0"}, "cpu", draft=False)
    measured = max(line["typical"] for entry in calibration() if entry["device"] == "cpu" for line in entry["clean"]
                   if line.get("against", "oracle") == "oracle")
    assert cpu["typical"] == round(MARGIN * measured, 6) and cpu["calibrated_here"]
    h100 = calibrated({"layers": [{"kv_cache_dtype": "fp8"}], "weight_dtypes": ["bfloat16"], "gpu_class": "H100",
                       "vllm_version": "0.34.0"}, "cuda", draft=False)
    assert h100["typical"] == round(MARGIN * 0.003264, 6) and h100["measured_on"].startswith("H100 vLLM 0.34.0")
    assert h100["calibrated_here"] and "not calibrated" not in describe(h100)
    b200 = calibrated({"layers": [{"kv_cache_dtype": "fp8"}], "weight_dtypes": ["bfloat16"], "gpu_class": "B200",
                       "vllm_version": "0.34.0"}, "cuda", draft=False)
    assert b200["typical"] == h100["typical"]
    assert not b200["calibrated_here"] and "not calibrated on this class and release" in describe(b200)
    # Against the bf16 reference the cache's own quantization cost counts too: the trained MLA's fp8 on the H200.
    against_reference = calibrated({"layers": [{"kv_cache_dtype": "fp8"}], "weight_dtypes": ["bfloat16"]}, "cuda",
                                   draft=False, against="reference")
    assert against_reference["typical"] == round(MARGIN * 0.03096, 6) and "trained-mla" in against_reference[
        "measured_on"]
    # FP8 weights on the CPU were never measured: bf16 weights' allowance stands in, and says so.
    fp8_on_cpu = calibrated({"layers": [{"kv_cache_dtype": "auto"}], "weight_dtypes": ["float8_e4m3fn"]}, "cpu",
                            draft=True)
    assert any("not measured" in note for note in fp8_on_cpu["notes"])


def test_a_draft_pair_is_judged_by_its_distance_not_a_logprob_tolerance(records):
    """The FP8-weight GLM with its MTP draft against its no-draft twin: the tokens part at a 0.2-logprob swap of two
    tokens, which the fixed-tolerance close rule fails; under the same context the two runs' distributions are
    0.0039 apart, within what a draft with FP8 weights measured."""
    draft, twin = records[GLM_FP8_MTP], records[GLM_FP8_NO_DRAFT]
    close = compare_tokens(draft, twin, exact=False, rule=Differential())
    assert not close["ok"] and "tie" in close["detail"]
    shared = judge_shared_context({**draft, "weight_dtypes": FP8_CHECKPOINT_DTYPES}, twin,
                                  calibrated({**draft, "weight_dtypes": FP8_CHECKPOINT_DTYPES}, "cuda", draft=True))
    assert shared["ok"], shared["detail"]
    assert shared["typical"] == pytest.approx(0.00385, abs=5e-5) and "a draft" in shared["detail"]


def test_a_draft_pair_far_outside_its_allowance_fails(records):
    """The same pair with the draft cell's distributions garbled (each position's top tokens' logprobs rotated):
    the distance under the same context is far outside the allowance."""
    draft, twin = copy.deepcopy(records[GLM_FP8_MTP]), records[GLM_FP8_NO_DRAFT]
    for sequence in draft["logprobs"]:
        for p, position in enumerate(sequence):
            tokens, values = list(position), list(position.values())
            sequence[p] = dict(zip(tokens, values[1:] + values[:1], strict=True))
    shared = judge_shared_context(draft, twin, calibrated(draft, "cuda", draft=True))
    assert not shared["ok"] and shared["typical"] > 3 * shared["allowed"]
    assert "> 0.0077 allowed" in shared["detail"]


def test_the_calibration_data_names_its_source_for_every_entry():
    for entry in calibration():
        assert entry["device"] in ("cpu", "cuda") and entry["source"] and entry["clean"]
        for line in entry["clean"]:
            assert line["kv"] in ("unquantized", "quantized") and line["weights"] in ("bf16", "fp8")
            assert line["positions"] > 0 and line["cells"]
