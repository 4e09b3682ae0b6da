"""Failure classification, on messages captured from real cell runs (tests/fixtures/records) and on the GPU
messages recorded in shared/vllm-facts.md; plus the version ranges the tables are keyed on. No vLLM needed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kvmatrix.harness.judge.signatures import classify, last_exception_line
from kvmatrix.harness.vllm_compat import (
    BUILDER_DTYPE_ATTRS,
    SIGNATURES,
    for_version,
    installed_vllm_version,
    known_kv_cache_dtypes,
    release_tuple,
    version_matches,
)
from kvmatrix.matrix.conditions import matches, when_matches

RECORDS = Path(__file__).parent / "fixtures" / "records" / "cpu-vllm-0.32.0"


def load(name: str) -> dict:
    return json.loads((RECORDS / f"{name}.json").read_text())


def failure_text(result: dict) -> str:
    """What the runner hands the classifier: exception message, traceback tail, then the log's tail."""
    exception = result.get("exception") or {}
    return "\n".join(filter(None, [exception.get("message"), exception.get("traceback_tail"), result["log_tail"]]))


@pytest.mark.parametrize(("record", "signature"), [
    ("ct_llama-fp8_e5m2", "fp8_e5m2_with_fp8_checkpoint"),
    ("deepseek_v2-fp8", "dtype_mismatch_at_decode"),
    ("deepseek_v2-fp8-skip0", "dtype_mismatch_at_decode"),
    ("llama-int3", "unsupported_kv_cache_dtype"),
    ("llama-tiny-cache", "out_of_memory"),
])
def test_captured_cpu_failures(record: str, signature: str) -> None:
    result = load(record)
    assert result["status"] == "crash"
    assert classify(failure_text(result), result["vllm_version"]) == signature
    # The message alone (no traceback, no log) is enough too.
    assert classify(result["exception"]["message"], result["vllm_version"]) == signature


def test_every_crash_fixture_is_classified() -> None:
    crashes = [load(p.stem) for p in RECORDS.glob("*.json")]
    crashes = [r for r in crashes if r["status"] == "crash"]
    assert crashes
    for result in crashes:
        assert classify(failure_text(result), result["vllm_version"]) is not None, result["cell_id"]


@pytest.mark.parametrize(("text", "signature"), [
    # Messages seen on the H200 with vLLM 0.26.0 (shared/vllm-facts.md).
    ("ValueError: No common block size for 32.", "no_common_block_size"),
    ("RuntimeError: fp8 tensor core is not supported in fa2 backend", "fp8_unsupported_arch"),
    ("RuntimeError: k_scale must be positive for FP8 path", "k_scale_not_positive"),
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
     "out_of_memory"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "out_of_memory"),
    ("ModuleNotFoundError: No module named 'cutlass'", "cutlass_missing"),
    # The shape of vLLM's selector error: its reasons name dtypes, but the signature is the missing backend.
    ("ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(head_size=32, "
     "kv_cache_dtype=fp8). Reasons: {FLASH_ATTN: [kv_cache_dtype not supported, non-causal attention not "
     "supported]}", "no_valid_backend"),
    # A real crash of a broken tiny checkpoint (glm_mla without MoE layers): not a KV-cache failure, no name (its
    # fingerprint groups it).
    ("RuntimeError: No Glm4MoE layer found in model.layers.", None),
    ("", None),
])
def test_known_messages(text: str, signature: str) -> None:
    assert classify(text, "0.26.0") == signature
    assert classify(text, None) == signature


def test_exception_lines_win_over_log_chatter() -> None:
    log = ("INFO 11-29 [autotune.py:10] CUDA out of memory while autotuning, retrying with smaller tiles\n"
           "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
           "RuntimeError: expected scalar type BFloat16 but found Float8_e4m3fn\n")
    assert classify(log, "0.32.0") == "dtype_mismatch_at_decode"


def test_last_exception_line() -> None:
    result = load("ct_llama-fp8_e5m2")
    assert last_exception_line(result["log_tail"]) == (
        "ValueError: fp8_e5m2 kv-cache is not supported with fp8 checkpoints.")
    line = "(EngineCore pid=1) ERROR 11-29 12:00:00 [core.py:9] ValueError: No common block size for 32."
    assert last_exception_line(f"noise\n{line}\nshutting down\n") == "ValueError: No common block size for 32."
    assert last_exception_line("killed\n\n") == "killed"
    assert last_exception_line("") == ""


def test_signature_table_is_well_formed() -> None:
    names = [name for name, _, _ in SIGNATURES]
    assert len(names) == len(set(names))
    # Reserved: signal crashes are named signal_<SIGNAL> by the runner.
    assert not any(name.startswith("signal_") for name in names)
    for _, versions, patterns in SIGNATURES:
        version_matches("0.26.0", versions)  # parses
        assert patterns and all(isinstance(p, str) for p in patterns)


@pytest.mark.parametrize(("version", "specifier", "expected"), [
    ("0.26.0", ">=0.25", True),
    ("0.24.1", ">=0.25", False),
    ("0.25", ">=0.25.0", True),
    ("0.25.0rc1.dev3+g1234", ">=0.25", True),  # a pre-release counts as its release
    ("0.32.0+cpu", ">=0.20,<0.24", False),
    ("0.22.0", ">=0.20,<0.24", True),
    ("0.26.0", "", True),
    (None, "<0.1", True),  # unknown version: every range applies
])
def test_version_matches(version: str | None, specifier: str, expected: bool) -> None:
    assert version_matches(version, specifier) is expected


def test_release_tuple_rejects_garbage() -> None:
    assert release_tuple("v0.26.0") == (0, 26)
    with pytest.raises(ValueError):
        release_tuple("dev")


def test_builder_query_dtype_names_follow_the_version() -> None:
    def names(version: str) -> set[str]:
        return {a for attrs in for_version(BUILDER_DTYPE_ATTRS, version) for a in attrs}

    assert {"q_data_type_prefill", "q_data_type_decode", "cache_dtype"} <= names("0.26.0")
    assert "q_data_type" not in names("0.26.0")
    assert "q_data_type" in names("0.24.0") and "q_data_type_prefill" not in names("0.24.0")


@pytest.mark.skipif(installed_vllm_version() is None, reason="vLLM is not installed")
def test_known_kv_cache_dtypes_reads_the_installed_vllm_cheaply() -> None:
    known_kv_cache_dtypes.cache_clear()
    started = time.monotonic()
    dtypes = known_kv_cache_dtypes()
    assert time.monotonic() - started < 1.0  # read from source, not by importing vLLM
    assert {"auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"} <= dtypes
    assert "int3" not in dtypes


@pytest.mark.parametrize("version", ["0.25.0rc1.dev3", "0.25.0rc1.dev3+g1234", "0.24.9", "0.25.0", "0.27.0rc1",
                                     "0.26.0+cu130", "v0.26.0"])
@pytest.mark.parametrize("specifier", [">=0.25", "<0.27", ">=0.20,<0.25", "==0.25", "!=0.25.0", ">0.24"])
def test_one_version_rule_for_tables_and_when_clauses(version: str, specifier: str) -> None:
    """vLLM-version tables (vllm_compat) and `when:` ranges (matrix/conditions.py) read a version alike."""
    assert version_matches(version, specifier) is matches(specifier, version)


def test_a_pre_release_counts_as_its_release_everywhere() -> None:
    assert version_matches("0.25.0rc1.dev3", ">=0.25") is True
    assert matches(">=0.25", "0.25.0rc1.dev3") is True
    assert when_matches({"vllm_version": ">=0.25"}, {"vllm_version": "0.25.0rc1.dev3"}) is True
    assert matches("<0.25", "0.25.0rc1.dev3") is False


def test_every_crash_of_the_held_records_has_a_name():
    """Every crash of every release and class the fixtures hold is named by a signature under today's table (a
    report then says what happened, never a bare hash), with the records' exceptions and log tails as stored."""
    import json
    from pathlib import Path

    from kvmatrix.harness.judge.outcome import reclassified
    from kvmatrix.harness.record.files import RunDir

    fixtures = Path(__file__).parent / "fixtures"
    unnamed, crashes = [], 0
    for path in sorted(fixtures.rglob("*.json")):
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or "cell_id" not in record or record.get("status") != "crash":
            continue
        crashes += 1
        record = reclassified(record, RunDir(path.parent).log_tail(record))
        if not record.get("signature"):
            unnamed.append(f"{path.relative_to(fixtures)}: {record.get('error_tail')}")
    assert crashes > 100 and unnamed == []
