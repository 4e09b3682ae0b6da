"""The digit-reversal task every trained model here learns (`48213=` → `31284`), and what they share: its
character-level tokenizer, the trained Llama's config (a draft's and the MLA model's start from it), its batches,
the one training loop and the checkpoint writing. trained.py, trained_mla.py and trained_draft.py each build on it;
none imports another's builders for it.

Reversal is the task because every answer token must be read back from the prompt's KV cache, so whatever a
KV-cache setting does to keys and values shows up in exact match; chance is ~0 (10^-len).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<mask>"]
BOS, EOS, PAD = 0, 1, 2
MIN_DIGITS, MAX_DIGITS = 4, 9
SEED = 0
LR = 3e-3
THREADS = 1  # fixed: CPU reductions depend on the thread count; one thread is also fastest on a busy 2-core box


def task_example(rng: random.Random) -> tuple[str, str]:
    """(prompt, answer) of the reversal task; the same text the lm-eval task's JSONL holds."""
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(MIN_DIGITS, MAX_DIGITS)))
    return f"{digits}=", digits[::-1]


def tokenizer():
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
    tokenizer().save(str(out / "tokenizer.json"))
    names = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    write_json(out / "special_tokens_map.json", names)
    write_json(out / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                 "model_max_length": max_len, **names, "add_bos_token": True,
                                                 "clean_up_tokenization_spaces": False})


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def llama_config() -> dict:
    # head_dim 64 fits every backend (CPU attention, FlashAttention, FlashInfer); 2 KV heads exercise GQA.
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": len(SPECIAL_TOKENS) + 256,
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 256, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "attention_bias": False,
    }


def batch(rng: random.Random, tok, size: int):
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


def train(model, steps: int, size: int, log: Callable[[str], None], seed: int = SEED):
    """`model` (fp32, transformers, its initial weights drawn) trained on the task: the one loop of every trained
    model here, deterministic for a given torch build and machine kind (`seed`: the order of its batches)."""
    import torch

    tok, rng = tokenizer(), random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=steps, pct_start=0.1)
    model.train()
    for step in range(steps):
        ids, lab = batch(rng, tok, size)
        loss = model(input_ids=ids, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 200 == 0 or step == steps - 1:
            log(f"step {step} loss {loss.item():.4f}")
    return model.eval()


def save(out: Path, cfg: dict, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_json(out / "config.json", cfg)
    write_json(out / "generation_config.json", {"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": False})
    _write_tokenizer(out, cfg["max_position_embeddings"])
