"""Findings by what vLLM does, not by the cells they were first seen in: each known failure's name, the site where
vLLM fails, what shows it in a record (a crash signature of signatures.py, or a built-in check that fails) and the
configuration that triggers it (a `when:` over the cell's axes, as case files write one). A waiver that names a
finding (`finding=<name>` in cases/_waivers.txt, harness/judge/waivers.py) holds wherever the finding shows, in
every case and on every class, within the waiver's vLLM releases; the releases it holds for are the waiver's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FindingSignature:
    title: str  # what reports call it
    site: str  # where vLLM fails: a `module:function` (the crash fingerprint's site) or the check that fails
    when: dict[str, Any] = field(default_factory=dict)  # the configuration that triggers it (the cell's axes)
    signature: str | None = None  # the crash signature (or family) it crashes with
    check: str | None = None  # else the built-in check it fails: a rule row starting `<check>:`


FINDING_SIGNATURES: dict[str, FindingSignature] = {
    # vLLM 0.34.0 (H200): a bf16 target with a draft whose own KV cache is fp8, on the default FLASH_ATTN (FA3),
    # crashes in its start-up warm-up, in FlashAttention's scheduler metadata (reports/findings/README.md
    # #h200-draft-fp8-kv-under-bf16-target-crashes-flash-attn).
    "fa3-scheduler-metadata-dtype": FindingSignature(
        "FA3 scheduler-metadata dtype", "vllm.vllm_flash_attn.flash_attn_interface:get_scheduler_metadata",
        {"kv_cache_dtype": ["auto", "bfloat16"], "draft_kv_cache_dtype": "fp8"},
        signature="fa3_scheduler_metadata_dtype"),
    # vLLM 0.33.0 and 0.34.0 (H200): with FULL CUDA graphs forced, the first decode step diverges from eager
    # (reports/findings/README.md#full-cudagraph-decode-diverges).
    "full-cudagraph-decode-diverges": FindingSignature(
        "FULL CUDA graph decode diverges from eager", "differential", {"execution": "graphs_full"},
        check="differential"),
}
