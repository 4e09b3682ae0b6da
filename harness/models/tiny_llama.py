"""The tiny Llama family: the dense target (`llama`), the same weights as a compressed-tensors FP8-KV checkpoint
(`ct_llama`), and the drafts that pair with it for speculative decoding (a DFlash draft, an EAGLE-3 draft with
its target layer ids nested or flat). Drafts take the target's attention shape and number their own layers
after the target's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kvmatrix.harness.models.checkpoint import (
    MASK,
    VOCAB,
    common,
    head_shapes,
    kv_only_quantization,
    layer_shapes,
    save,
    static_kv_scales,
)


# ---------------------------------------------------------------------------------------------- llamas
def llama_config() -> dict:
    # head_dim 64: a size every backend takes (CPU attention 32/64/80/..., FlashAttention, FlashInfer 64/128/256),
    # so the same checkpoint runs on the CPU and on every GPU class; 2 KV heads exercise GQA.
    return {**common("LlamaForCausalLM", "llama"), "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}


def _llama_shapes(cfg: dict, qk_norm: bool = False, prefix: str = "model.") -> dict:
    h, d = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    attn: dict[str, tuple[int, ...]] = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q)}
    if qk_norm:  # Qwen3-style per-head norms (the DFlash draft's layer)
        attn |= {"q_norm": (d,), "k_norm": (d,)}
    return layer_shapes(cfg, attn, prefix)


def build_llama(out: Path, seed: int = 0) -> None:
    cfg = llama_config()
    save(out, cfg, head_shapes(cfg) | _llama_shapes(cfg), seed)


def build_ct_llama(out: Path, seed: int = 0, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """`llama`'s weights (same seed, same tensors) declared as a compressed-tensors checkpoint with a static
    per-tensor FP8 KV cache. Scale 1.0 fits these weights (|K|, |V| stay far below fp8's 448); a tiny scale
    such as 1e-4 makes fp8 clip on purpose."""
    cfg = llama_config()
    cfg["quantization_config"] = kv_only_quantization()
    scales = static_kv_scales(cfg["num_hidden_layers"], k_scale, v_scale)
    save(out, cfg, head_shapes(cfg) | _llama_shapes(cfg), seed, scales)


def _draft_of_llama(arch: str, model_type: str) -> dict:
    """A one-layer draft config whose attention has the target llama's shape (heads, KV heads, head dim)."""
    t = llama_config()
    return {**common(arch, model_type, layers=1),
            **{k: t[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")}}


def dflash_config() -> dict:
    t = llama_config()
    return {
        **_draft_of_llama("DFlashDraftModel", "qwen3"),
        # block_size: the draft's parallel block (real DFlash drafts use 16); vLLM reads
        # num_speculative_tokens from speculative_config, not from here.
        "block_size": 4,
        "num_target_layers": t["num_hidden_layers"],
        # target_layer_ids count from 0 and vLLM captures the hidden state after layer id (input of id+1),
        # so ids must stay below num_target_layers - 1: [0, 2] reads the inputs of layers 1 and 3.
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 2]},
    }


def build_dflash_llama(out: Path, seed: int = 0) -> None:
    """DFlash draft for `llama`: one Qwen3 layer plus `fc` (concatenated target hidden states -> hidden) and
    `hidden_norm`. No embed_tokens / lm_head: vLLM shares the target's. Names have no `model.` prefix,
    as in z-lab's DFlash checkpoints (vLLM's loader adds it)."""
    cfg = dflash_config()
    h, n_aux = cfg["hidden_size"], len(cfg["dflash_config"]["target_layer_ids"])
    shapes = _llama_shapes(cfg, qk_norm=True, prefix="")
    shapes |= {"fc.weight": (h, h * n_aux), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    save(out, cfg, shapes, seed + 1)  # its own stream, independent of the target's tensors


# ---------------------------------------------------------------------------------------------- EAGLE-3
EAGLE3_AUX_LAYERS = [1, 2, 3]  # the target's hidden states at these layers' inputs feed `fc`: any three of 4


def eagle3_config() -> dict:
    t = llama_config()
    return {
        **_draft_of_llama("LlamaForCausalLMEagle3", "llama"),
        "draft_vocab_size": VOCAB,  # the full vocab: no d2t / t2d mapping tensors needed
        "target_hidden_size": t["hidden_size"],
        # Nested, as some exported drafts write it: vLLM 0.26.0's GPU runner does not read this form
        # (reports/findings: eagle3-gpu-runner-ignores-nested-aux-layer-ids).
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": EAGLE3_AUX_LAYERS},
    }


def eagle3_flat_config() -> dict:
    """The same draft with its layer ids at the top level, the form every runner reads: its cells reach the KV
    cache (class 6) where the nested form dies first."""
    cfg = {k: v for k, v in eagle3_config().items() if k != "eagle_config"}
    return {**cfg, "eagle_aux_hidden_state_layer_ids": EAGLE3_AUX_LAYERS}


def build_eagle3_llama(out: Path, seed: int = 0, config: Callable[[], dict] = eagle3_config) -> None:
    """EAGLE-3 draft for `llama`, laid out as the published EAGLE-3 checkpoints: one `midlayer` whose q/k/v take
    [embeds, hidden] (2 x hidden), `fc` over three target hidden states, its own lm_head; no embed_tokens
    (vLLM shares the target's)."""
    cfg = config()
    h, d = cfg["hidden_size"], cfg["head_dim"]
    q, kv, i = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d, cfg["intermediate_size"]
    n_aux = len(EAGLE3_AUX_LAYERS)
    shapes = {
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "fc.weight": (h, h * n_aux),
        "norm.weight": (h,),
        "lm_head.weight": (cfg["draft_vocab_size"], h),
    }
    save(out, cfg, shapes, seed + 2)  # its own stream, independent of the target's and the DFlash draft's


def build_eagle3_llama_flat(out: Path, seed: int = 0) -> None:
    build_eagle3_llama(out, seed, eagle3_flat_config)
