"""Tiny models the project trains itself, so that accuracy has a real signal offline: a 2-layer Llama that
reverses digit strings (`48213=` → `31284`), trained deterministically on the CPU in a few minutes, and the same
task on DeepSeek-V2-style MLA (trained_mla.py).

The task, its tokenizer, the training loop and the checkpoint writing are reversal.py's, shared with trained_mla.py
and trained_draft.py.

    path = build("trained_llama", cache_dir)                     # trained checkpoint with its tokenizer
    path = build("trained_llama_ct", cache_dir, k_scale=0.01)    # the same weights as an FP8-KV checkpoint

Folders are named by builder, options and a hash of this module's source plus library versions (the scheme of
tiny_models), built in a temp folder and renamed atomically.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from kvmatrix.harness.models.cache import BuilderFamily
from kvmatrix.harness.models.checkpoint import TORCH_DEFAULTS, kv_only_quantization, static_kv_scales
from kvmatrix.harness.models.reversal import SEED, THREADS, llama_config, save, train
from kvmatrix.harness.models.trained_mla import build_trained_mla

STEPS, BATCH = 800, 48


def _log(message: str) -> None:
    print(f"kvmatrix: training trained_llama: {message}", file=sys.stderr, flush=True)


def train_llama(steps: int = STEPS, log: Callable[[str], None] = _log):
    """The trained fp32 model (transformers), deterministic for a given torch build and machine kind."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    cfg = llama_config()
    with TORCH_DEFAULTS:  # the initial weights come from the global generator, in the default dtype
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(LlamaConfig(**{**cfg, "torch_dtype": "float32"}))
    return train(model, steps, BATCH, log)


def build_trained_llama(out: Path) -> None:
    import torch

    model = train_llama()
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save(out, llama_config(), tensors)


def build_trained_llama_ct(out: Path, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """The trained weights declared as a compressed-tensors checkpoint with a static per-tensor FP8 KV cache
    (the ct_llama recipe of tiny_models). Scales far from |K|/448, |V|/448 make fp8 clip or underflow."""
    from safetensors.torch import load_file

    cfg = llama_config()
    cfg["quantization_config"] = kv_only_quantization()
    scales = static_kv_scales(cfg["num_hidden_layers"], k_scale, v_scale)  # checked before any training
    trained = build("trained_llama", out.parent)
    tensors = load_file(str(trained / "model.safetensors")) | scales
    save(out, cfg, tensors)


BUILDERS: dict[str, Callable] = {
    "trained_llama": build_trained_llama,
    "trained_llama_ct": build_trained_llama_ct,
    # Scale 0.01 clips |K|, |V| above 4.48: measured 0.99 → 0.65 exact match (1e-4 gives 0.0, 100 changes nothing).
    "trained_llama_ct_clipping": functools.partial(build_trained_llama_ct, k_scale=0.01, v_scale=0.01),
    "trained_mla": build_trained_mla,  # trained_mla.py: the same task on DeepSeek-V2-style MLA
}


_FAMILY = BuilderFamily(__name__, BUILDERS, also=("kvmatrix.harness.models.reversal",
                                                   "kvmatrix.harness.models.checkpoint",
                                                   "kvmatrix.harness.models.trained_mla",
                                                   "kvmatrix.harness.models.tiny_mla"))
folder_name = _FAMILY.folder_name
# One build of this family at a time in a process (a run builds models in its slots' threads): every builder
# here needs the one training, which draws from torch's global generator, so two threads training side by side
# would each draw the other's numbers (weights unlike a lone build's) and train twice. Reentrant: the FP8-KV
# builders build the trained model inside their own build.
_ONE_AT_A_TIME = threading.RLock()


def build(name: str, cache_dir: Path, **options) -> Path:
    """The checkpoint folder of builder `name` (with `options`), built once (see BuilderFamily.build)."""
    with _ONE_AT_A_TIME:
        return _FAMILY.build(name, cache_dir, **options)
