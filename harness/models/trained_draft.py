"""A trained draft for `trained-llama` (harness/models/trained.py), so that speculative decoding's acceptance means
something offline: a smaller Llama taught the same digit-reversal task, run by vLLM as a separate draft model
(speculative method `draft_model`). On the task's prompts it proposes what the target answers, so most of its
tokens are accepted; a draft whose KV cache is read wrong (a dtype, a backend, an execution mode) loses that, while
the target keeps the outputs right, and only the acceptance shows it.

Its attention differs from the target's as real drafts' does: 2 heads over 1 KV head of size 32 (the target: 4
over 2 of size 64), hidden 64. Two layers: reversing needs one to find the `=` and one to copy the mirrored digit.
The tokenizer and vocabulary are the target's (vLLM requires a draft model's vocabulary to match).

    path = build("trained_llama_draft", cache_dir)   # about 40 s on one core, cached like the trained target
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path

from kvmatrix.harness.models import reversal
from kvmatrix.harness.models.cache import BuilderFamily
from kvmatrix.harness.models.checkpoint import TORCH_DEFAULTS

SEED = 1  # its own initial weights, not the target's
STEPS, BATCH, LR = 800, 48, 3e-3


def draft_config() -> dict:
    """The target's config (vocabulary, special tokens, context) with a smaller attention and width."""
    return {**reversal.llama_config(), "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 32}


def _log(message: str) -> None:
    print(f"kvmatrix: training trained_llama_draft: {message}", file=sys.stderr, flush=True)


def train_draft(steps: int = STEPS, log: Callable[[str], None] = _log):
    """The trained fp32 draft (transformers), on the target's task and batches, deterministic as the target is."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(reversal.THREADS)
    torch.use_deterministic_algorithms(True)
    cfg = draft_config()
    with TORCH_DEFAULTS:  # the initial weights come from the global generator, in the default dtype
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(LlamaConfig(**{**cfg, "torch_dtype": "float32"}))
    return reversal.train(model, steps, BATCH, log, seed=SEED)


def build_trained_llama_draft(out: Path) -> None:
    import torch

    model = train_draft()
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    reversal.save(out, draft_config(), tensors)


BUILDERS: dict[str, Callable] = {"trained_llama_draft": build_trained_llama_draft}
# Its folder's fingerprint covers the task's module too: the task, tokenizer, batches and config are the target's.
_FAMILY = BuilderFamily(__name__, BUILDERS, also=("kvmatrix.harness.models.reversal",
                                                  "kvmatrix.harness.models.checkpoint"))
folder_name = _FAMILY.folder_name
_ONE_AT_A_TIME = threading.Lock()  # two slots needing it train it once


def build(name: str, cache_dir: Path, **options) -> Path:
    """The checkpoint folder of builder `name`, built once (see BuilderFamily.build)."""
    with _ONE_AT_A_TIME:
        return _FAMILY.build(name, cache_dir, **options)
