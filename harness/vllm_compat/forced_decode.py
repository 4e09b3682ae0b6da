"""Teacher-forced decode through vLLM's own decode path: a logits processor that lets a request choose only the
next of the tokens it is given (another run's greedy tokens), so that every decode step of a cell runs under the
very context of the run it is compared with, while the sampler still records the model's own (raw) logprobs.

vLLM V1 (0.32 on the CPU, 0.33 and 0.34 on CUDA: `vllm/v1/sample/logits_processor/`) loads custom processors
named by `LLM(logits_processors=["module:Class"])` in the engine's worker; a request opts in through
`SamplingParams.extra_args`. The sampler computes the logprobs it returns from the raw logits before any logits
processor runs (`logprobs_mode` "raw_logprobs", the default: `Sampler.forward` in vllm/v1/sample/sampler.py), and
the token it gathers besides the top ones is the sampled, i.e. the forced, one. vLLM refuses custom logits
processors where speculative decoding is on ("Custom logits processors are not supported when speculative
decoding is enabled."): such cells are compared free-running only.

This module imports vLLM: only the engine's worker loads it (by the name in FORCED_DECODE_PROCESSOR).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from kvmatrix.harness.vllm_compat.forcing import FORCED_TOKENS_KEY


class ForcedTokens(AdapterLogitsProcessor):
    """Each request whose `extra_args` name forced tokens emits exactly those, one per step; others are left alone."""

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the greedy choice: vLLM must apply it to greedy requests too

    def new_req_logits_processor(self, params: SamplingParams
                                 ) -> Callable[[list[int], torch.Tensor], torch.Tensor] | None:
        forced = (params.extra_args or {}).get(FORCED_TOKENS_KEY)
        if not forced:
            return None
        tokens = [int(t) for t in forced]

        def force(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            step = len(output_ids)
            if step >= len(tokens):
                return logits
            # Every other token impossible, the forced one certain: argmax picks it even where the logits are
            # NaN or -inf (a broken kernel), so the comparison goes on and shows the damage in the raw logprobs.
            only = torch.full_like(logits, float("-inf"))
            only[tokens[step]] = 0.0
            return only

        return force
