"""Drafts whose attention differs from their target's, as real drafts' often does: the tiny `llama` target has 4
heads over 2 KV heads of size 64 (GQA 2); these drafts bring other head counts, GQA ratios and head sizes into the
same engine, so the draft's KV cache has its own page size next to the target's.

- `eagle3_llama_gqa4`: an EAGLE-3 draft (target layer ids at the top level) with 4 heads over 1 KV head of size 32
  (GQA 4, half the target's head size).
- `dflash_llama_mha`: a DFlash draft with 2 heads and 2 KV heads of size 32 (no GQA).
- `llama_draft_small`: a separate small Llama for speculative method `draft_model`: hidden 64, 2 heads over 1 KV
  head of size 32, one layer, the target's vocabulary and tokenizer (vLLM checks they agree).

EAGLE-3 and DFlash drafts share the target's embedding (their hidden size is the target's); a `draft_model` draft
is a whole model of its own. Every size is one vLLM's CPU attention takes (head sizes 32, 64, 80, ...).
"""

from __future__ import annotations

from pathlib import Path

from kvmatrix.harness.models.checkpoint import common, head_shapes, layer_shapes, save
from kvmatrix.harness.models.tiny_llama import build_eagle3_llama, dflash_config, eagle3_flat_config


def _attention(heads: int, kv_heads: int, head_dim: int) -> dict:
    return {"num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim}


def eagle3_gqa4_config() -> dict:
    return {**eagle3_flat_config(), **_attention(4, 1, 32)}


def build_eagle3_llama_gqa4(out: Path, seed: int = 0) -> None:
    build_eagle3_llama(out, seed + 1, eagle3_gqa4_config)  # its own stream (one of the four standalone scripts redraw)


def dflash_mha_config() -> dict:
    return {**dflash_config(), **_attention(2, 2, 32)}


def build_dflash_llama_mha(out: Path, seed: int = 0) -> None:
    """As tiny_llama.build_dflash_llama, with this module's attention shape."""
    cfg = dflash_mha_config()
    h, d, n_aux = cfg["hidden_size"], cfg["head_dim"], len(cfg["dflash_config"]["target_layer_ids"])
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    attn: dict[str, tuple[int, ...]] = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
                                        "q_norm": (d,), "k_norm": (d,)}
    shapes = layer_shapes(cfg, attn, prefix="")
    shapes |= {"fc.weight": (h, h * n_aux), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    save(out, cfg, shapes, seed + 3)


def llama_draft_small_config() -> dict:
    return {**common("LlamaForCausalLM", "llama", layers=1), "hidden_size": 64, "intermediate_size": 128,
            **_attention(2, 1, 32)}


def build_llama_draft_small(out: Path, seed: int = 0) -> None:
    cfg = llama_draft_small_config()
    d, h = cfg["head_dim"], cfg["hidden_size"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    attn: dict[str, tuple[int, ...]] = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q)}
    save(out, cfg, head_shapes(cfg) | layer_shapes(cfg, attn), seed + 3)
