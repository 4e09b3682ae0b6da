"""Speculative decoding's acceptance, as vLLM counts it: the engine's spec-decode counters (`LLM.get_metrics()`,
kept with `disable_log_stats=False`, which the harness sets for every draft cell) read before and after the cell's
generation, so what an earlier engine of a warm worker counted never leaks into this cell's figures."""

from __future__ import annotations

from typing import Any

from kvmatrix.harness import vllm_compat as compat
from kvmatrix.harness.record.types import SpecDecodeRun


def counters(llm: Any, version: str | None) -> dict[str, Any] | None:
    """The spec-decode counters now (None where the engine keeps no metrics): field -> count (per position: a
    list)."""
    names = compat.for_version(compat.SPEC_DECODE_METRICS, version)[0]
    try:
        metrics = llm.get_metrics()
    except Exception:  # an engine without stats asserts; its acceptance is unknown, not zero
        return None
    out: dict[str, Any] = {}
    for field, name in names.items():
        found = [m for m in metrics if getattr(m, "name", None) == name]
        if field == "accepted_per_position":
            vectors = [list(getattr(m, "values", None) or []) for m in found]
            out[field] = [sum(column) for column in zip(*vectors, strict=False)] if vectors else []
        else:
            out[field] = sum(getattr(m, "value", 0) or 0 for m in found)
    return out


def acceptance(before: dict[str, Any] | None, after: dict[str, Any] | None) -> SpecDecodeRun:
    """What the generation drafted and accepted (the counters' difference), its acceptance rate (accepted draft
    tokens / draft tokens) and mean acceptance length (tokens per target step: 1 + accepted / drafts)."""
    if before is None or after is None:
        return {"note": "the engine kept no spec-decode metrics"}
    def since(field: str) -> int:
        return int(after[field] - before.get(field, 0))

    run: SpecDecodeRun = {"drafts": since("drafts"), "draft_tokens": since("draft_tokens"),
                          "accepted_tokens": since("accepted_tokens")}
    earlier = before.get("accepted_per_position") or []
    run["accepted_per_position"] = [int(n - (earlier[i] if i < len(earlier) else 0))
                                    for i, n in enumerate(after.get("accepted_per_position") or [])]
    if run["draft_tokens"]:
        run["acceptance_rate"] = round(run["accepted_tokens"] / run["draft_tokens"], 4)
    if run["drafts"]:
        run["mean_acceptance_length"] = round(1 + run["accepted_tokens"] / run["drafts"], 4)
    return run
