"""Tiny models the project trains itself, so that accuracy has a real signal offline: a 2-layer Llama that
reverses digit strings (`48213=` → `31284`), trained deterministically on the CPU in a few minutes, and the same
task on DeepSeek-V2-style MLA (trained_mla.py).

Reversal is the task because every answer token must be read back from the prompt's KV cache, so whatever a
KV-cache setting does to keys and values shows up in exact match; chance is ~0 (10^-len).

    path = build("trained_llama", cache_dir)                     # trained checkpoint with its tokenizer
    path = build("trained_llama_ct", cache_dir, k_scale=0.01)    # the same weights as an FP8-KV checkpoint

Folders are named by builder, options and a hash of this module's source plus library versions (the scheme of
tiny_models), built in a temp folder and renamed atomically.
"""

from __future__ import annotations

import functools
import json
import random
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from kvmatrix.harness.models.cache import BuilderFamily
from kvmatrix.harness.models.checkpoint import TORCH_DEFAULTS, kv_only_quantization, static_kv_scales
from kvmatrix.harness.models.trained_mla import build_trained_mla

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<mask>"]
BOS, EOS, PAD = 0, 1, 2
MIN_DIGITS, MAX_DIGITS = 4, 9
SEED = 0
STEPS, BATCH, LR = 800, 48, 3e-3
THREADS = 1  # fixed: CPU reductions depend on the thread count; one thread is also fastest on a busy 2-core box


def task_example(rng: random.Random) -> tuple[str, str]:
    """(prompt, answer) of the reversal task; the same text the lm-eval task's JSONL holds."""
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(MIN_DIGITS, MAX_DIGITS)))
    return f"{digits}=", digits[::-1]


# ---------------------------------------------------------------------------------------------- tokenizer
def _tokenizer():
    """Character level (every byte one token, no merges): digits are never merged, so the task is the same at
    every position, and any text still encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    return tok


def _write_tokenizer(out: Path, max_len: int) -> None:
    _tokenizer().save(str(out / "tokenizer.json"))
    names = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    _write_json(out / "special_tokens_map.json", names)
    _write_json(out / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                 "model_max_length": max_len, **names, "add_bos_token": True,
                                                 "clean_up_tokenization_spaces": False})


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------------------- model
def _llama_config() -> dict:
    # head_dim 64 fits every backend (CPU attention, FlashAttention, FlashInfer); 2 KV heads exercise GQA.
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": len(SPECIAL_TOKENS) + 256,
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 256, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "attention_bias": False,
    }


def _batch(rng: random.Random, tok, size: int):
    """Token ids and labels; the loss is on the answer and its end-of-line only (the prompt is random)."""
    import torch

    rows, labels = [], []
    for _ in range(size):
        prompt, answer = task_example(rng)
        p = tok.encode(prompt).ids
        a = tok.encode(answer + "\n", add_special_tokens=False).ids
        rows.append(p + a)
        labels.append([-100] * len(p) + a)
    width = max(map(len, rows))
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    lab = torch.tensor([la + [-100] * (width - len(la)) for la in labels])
    return ids, lab


def _log(message: str) -> None:
    print(f"kvmatrix: training trained_llama: {message}", file=sys.stderr, flush=True)


def train_llama(steps: int = STEPS, log: Callable[[str], None] = _log):
    """The trained fp32 model (transformers), deterministic for a given torch build and machine kind."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    cfg = _llama_config()
    with TORCH_DEFAULTS:  # the initial weights come from the global generator, in the default dtype
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(LlamaConfig(**{**cfg, "torch_dtype": "float32"}))
    return train(model, steps, BATCH, log)


def train(model, steps: int, batch: int, log: Callable[[str], None], seed: int = SEED):
    """`model` (fp32, transformers, its initial weights drawn) trained on the task: the one loop of every trained
    model here, deterministic for a given torch build and machine kind (`seed`: the order of its batches)."""
    import torch

    tok, rng = _tokenizer(), random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=steps, pct_start=0.1)
    model.train()
    for step in range(steps):
        ids, lab = _batch(rng, tok, batch)
        loss = model(input_ids=ids, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 200 == 0 or step == steps - 1:
            log(f"step {step} loss {loss.item():.4f}")
    return model.eval()


def _save(out: Path, cfg: dict, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", cfg)
    _write_json(out / "generation_config.json", {"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": False})
    _write_tokenizer(out, cfg["max_position_embeddings"])


def build_trained_llama(out: Path) -> None:
    import torch

    model = train_llama()
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    _save(out, _llama_config(), tensors)


def build_trained_llama_ct(out: Path, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """The trained weights declared as a compressed-tensors checkpoint with a static per-tensor FP8 KV cache
    (the ct_llama recipe of tiny_models). Scales far from |K|/448, |V|/448 make fp8 clip or underflow."""
    from safetensors.torch import load_file

    cfg = _llama_config()
    cfg["quantization_config"] = kv_only_quantization()
    scales = static_kv_scales(cfg["num_hidden_layers"], k_scale, v_scale)  # checked before any training
    trained = build("trained_llama", out.parent)
    tensors = load_file(str(trained / "model.safetensors")) | scales
    _save(out, cfg, tensors)


# -------------------------------------------------------------------------------------------------- API
BUILDERS: dict[str, Callable] = {
    "trained_llama": build_trained_llama,
    "trained_llama_ct": build_trained_llama_ct,
    # Scale 0.01 clips |K|, |V| above 4.48: measured 0.99 → 0.65 exact match (1e-4 gives 0.0, 100 changes nothing).
    "trained_llama_ct_clipping": functools.partial(build_trained_llama_ct, k_scale=0.01, v_scale=0.01),
    "trained_mla": build_trained_mla,  # trained_mla.py: the same task on DeepSeek-V2-style MLA
}


_FAMILY = BuilderFamily(__name__, BUILDERS, also=("kvmatrix.harness.models.checkpoint",
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
