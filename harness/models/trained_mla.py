"""A trained multi-head latent attention (MLA) model: DeepSeek-V2-style dense MLA that learned reversal.py's
digit-reversal task, so that the MLA decode paths (CPU_MLA, AMX_MLA; FlashMLA, FLASH_ATTN_MLA on CUDA) are judged
on outputs that mean something. Its latent head is kv_lora_rank 512 + rope 64 = 576, the only one CPU MLA's decode
kernel takes; the query's nope and the value dims are 128, which GPU MLA prefill backends need (tiny_mla.py).

Two layers, four heads, dense MLPs: trained with reversal.py's loop (the tokenizer, task and seed of the
trained Llama) in about a minute and a half of one CPU core (600 steps of 48 examples: 0.94 exact match measured
with transformers; 32 examples a step did not learn the task in 600 steps).
Built and cached with the trained family (trained.py `build`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from kvmatrix.harness.models import reversal
from kvmatrix.harness.models.checkpoint import TORCH_DEFAULTS
from kvmatrix.harness.models.tiny_mla import mla_config

STEPS, BATCH = 600, 48
LAYERS = 2


def _log(message: str) -> None:
    print(f"kvmatrix: training trained_mla: {message}", file=sys.stderr, flush=True)


def trained_mla_config() -> dict:
    """The checkpoint's config: tiny_mla's DeepSeek-V2 MLA with the trained Llama's vocabulary (reversal.py), two
    dense layers."""
    llama = reversal.llama_config()
    return {
        **mla_config("DeepseekV2ForCausalLM", "deepseek_v2"),
        **{k: llama[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "max_position_embeddings",
                                 "bos_token_id", "eos_token_id", "pad_token_id")},
        "num_hidden_layers": LAYERS,
        "first_k_dense_replace": LAYERS,  # every MLP dense
    }


def train_mla(steps: int = STEPS):
    """The trained fp32 model (transformers), deterministic for a given torch build and machine kind."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    torch.set_num_threads(reversal.THREADS)
    torch.use_deterministic_algorithms(True)
    cfg = trained_mla_config()
    with TORCH_DEFAULTS:  # the initial weights come from the global generator, in the default dtype
        torch.manual_seed(reversal.SEED)
        model = DeepseekV2ForCausalLM(DeepseekV2Config(**{**cfg, "torch_dtype": "float32"}))
    return reversal.train(model, steps, BATCH, _log)


def build_trained_mla(out: Path) -> None:
    import torch

    model = train_mla()
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    reversal.save(out, trained_mla_config(), tensors)
