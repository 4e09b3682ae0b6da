"""Tiny multi-head latent attention (MLA) models: DeepSeek-V2-style dense MLA, the GLM-4.7-Flash architecture
(MLA with one MoE layer), and DeepSeek-V3.2's sparse MLA with an indexer (config only: its backends are
CUDA-only and its dims make real weights pointless)."""

from __future__ import annotations

from pathlib import Path

from kvmatrix.harness.models.checkpoint import (
    BOS,
    EOS,
    LAYERS,
    common,
    head_shapes,
    layer_shapes,
    save,
    write_json,
    write_tokenizer,
)


def mla_config(arch: str, model_type: str) -> dict:
    # kv_lora_rank 512 + qk_rope_head_dim 64 = 576: the only latent head CPU MLA's decode kernel takes.
    # q_lora_rank null keeps q_proj plain; first_k_dense_replace = layers makes every MLP dense, while
    # n_routed_experts stays an int because transformers rejects null.
    return {
        **common(arch, model_type),
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        # 128 / 128: the dims GPU MLA prefill backends take (FLASH_ATTN rejected nope 32 / v 32 on the H200).
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "moe_intermediate_size": 64,
        "first_k_dense_replace": LAYERS,
        "moe_layer_freq": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "greedy",
        "norm_topk_prob": False,
        "routed_scaling_factor": 1.0,
        "scoring_func": "softmax",
    }


def _mla_shapes(cfg: dict) -> dict:
    h, nh, r = cfg["hidden_size"], cfg["num_attention_heads"], cfg["kv_lora_rank"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    attn = {
        "q_proj": (nh * (nope + rope), h),
        "kv_a_proj_with_mqa": (r + rope, h),
        "kv_a_layernorm": (r,),
        "kv_b_proj": (nh * (nope + v), r),
        "o_proj": (h, nh * v),
    }
    return head_shapes(cfg) | layer_shapes(cfg, attn)


def build_deepseek_v2(out: Path, seed: int = 0) -> None:
    cfg = mla_config("DeepseekV2ForCausalLM", "deepseek_v2")
    save(out, cfg, _mla_shapes(cfg), seed)


def glm_config() -> dict:
    cfg = mla_config("Glm4MoeLiteForCausalLM", "glm4_moe_lite")
    # vLLM's Glm4MoeLite refuses a model without any MoE layer ("No Glm4MoE layer found in model.layers."),
    # so only the last layer is MoE. transformers reads mlp_layer_types, vLLM first_k_dense_replace.
    cfg["first_k_dense_replace"] = LAYERS - 1
    cfg["mlp_layer_types"] = ["dense"] * (LAYERS - 1) + ["sparse"]
    cfg["scoring_func"], cfg["topk_method"], cfg["norm_topk_prob"] = "sigmoid", "noaux_tc", True
    return cfg


def glm_moe_shapes(cfg: dict, moe_layers) -> dict:
    """GLM MLA shapes whose `moe_layers` run routed experts (with a router bias) plus a shared expert."""
    shapes = _mla_shapes(cfg)
    h, e, i = cfg["hidden_size"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    ffn = {"gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}
    si = i * cfg["n_shared_experts"]
    for n in moe_layers:
        p = f"model.layers.{n}.mlp."
        for k in ffn:
            del shapes[p + k + ".weight"]
        shapes |= {p + "gate.weight": (e, h), p + "gate.e_score_correction_bias": (e,)}
        for x in range(e):
            shapes |= {f"{p}experts.{x}.{k}.weight": v for k, v in ffn.items()}
        shapes |= {f"{p}shared_experts.{k}.weight": (si, h) if k != "down_proj" else (h, si) for k in ffn}
    return shapes


def build_glm_mla(out: Path, seed: int = 0) -> None:
    cfg = glm_config()
    save(out, cfg, glm_moe_shapes(cfg, [LAYERS - 1]), seed)


# ------------------------------------------------------------------------------------- sparse MLA (GPU only)
def deepseek_v32_config() -> dict:
    """DeepSeek-V3.2 (the family `fp8_ds_mla` exists for), shrunk to what ran on an H200 with vLLM 0.26.0
    (vllm-facts.md). Its sparse backends are CUDA-only and its dims (64 heads, index_topk 2048) make real
    weights pointless: the checkpoint is config + tokenizer and the registry loads it with load_format dummy."""
    return {
        **mla_config("DeepseekV32ForCausalLM", "deepseek_v32"),
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "q_lora_rank": 256,
        "index_topk": 2048,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "moe_intermediate_size": 256,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
    }


def build_deepseek_v32(out: Path, seed: int = 0) -> None:
    del seed  # no weights: load_format dummy
    write_json(out / "config.json", deepseek_v32_config())
    write_json(out / "generation_config.json", {"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": False})
    write_tokenizer(out)
