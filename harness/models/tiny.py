"""Tiny local HF-format checkpoints that real vLLM loads, built deterministically and offline.

The matrix needs real (random but fixed) weights rather than `load_format="dummy"`: a `kv_cache_scheme`
checkpoint needs positive `k_scale`/`v_scale` tensors, and a DFlash draft must pair with a real target.
Every builder writes config.json, a byte-level BPE tokenizer trained here on a fixed corpus, and bf16
safetensors whose tensors are drawn from a generator seeded by (seed, tensor name), so the bytes depend on
neither dict order nor what was built before.

    path = build("ct_llama", cache_dir, k_scale=1e-4)   # folder with config.json, tokenizer, weights
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.models.cache import BuilderFamily
from harness.models.checkpoint import (
    BOS,
    EOS,
    LAYERS,
    MASK,
    ROPE,
    VOCAB,
    common,
    head_shapes,
    layer_shapes,
    save,
    write_json,
    write_tokenizer,
)


# ---------------------------------------------------------------------------------------------- llamas
def _llama_config() -> dict:
    # head_dim 64: a size every backend takes (CPU attention 32/64/80/..., FlashAttention, FlashInfer 64/128/256),
    # so the same checkpoint runs on the CPU and on every GPU class; 2 KV heads exercise GQA.
    return {**common("LlamaForCausalLM", "llama"), "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}


def _llama_shapes(cfg: dict, qk_norm: bool = False, prefix: str = "model.") -> dict:
    h, d = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    attn = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q)}
    if qk_norm:  # Qwen3-style per-head norms (the DFlash draft's layer)
        attn |= {"q_norm": (d,), "k_norm": (d,)}
    return layer_shapes(cfg, attn, prefix)


def build_llama(out: Path, seed: int = 0) -> None:
    cfg = _llama_config()
    save(out, cfg, head_shapes(cfg) | _llama_shapes(cfg), seed)


def build_ct_llama(out: Path, seed: int = 0, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """`llama`'s weights (same seed, same tensors) declared as a compressed-tensors checkpoint with a static
    per-tensor FP8 KV cache. Scale 1.0 fits these weights (|K|, |V| stay far below fp8's 448); a tiny scale
    such as 1e-4 makes fp8 clip on purpose."""
    import torch

    if not (k_scale > 0 and v_scale > 0):
        raise ValueError("k_scale and v_scale must be positive (vLLM rejects others on the FP8 path)")
    cfg = _llama_config()
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "dense",
        "quantization_status": "compressed",
        "config_groups": {},
        "ignore": ["lm_head"],
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True},
    }
    scales = {}
    for n in range(cfg["num_hidden_layers"]):
        scales[f"model.layers.{n}.self_attn.k_scale"] = torch.tensor(k_scale, dtype=torch.float32)
        scales[f"model.layers.{n}.self_attn.v_scale"] = torch.tensor(v_scale, dtype=torch.float32)
    save(out, cfg, head_shapes(cfg) | _llama_shapes(cfg), seed, scales)


def _draft_of_llama(arch: str, model_type: str) -> dict:
    """A one-layer draft config whose attention has the target llama's shape (heads, KV heads, head dim)."""
    t = _llama_config()
    return {**common(arch, model_type, layers=1),
            **{k: t[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")}}


def _dflash_config() -> dict:
    t = _llama_config()
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
    cfg = _dflash_config()
    h, n_aux = cfg["hidden_size"], len(cfg["dflash_config"]["target_layer_ids"])
    shapes = _llama_shapes(cfg, qk_norm=True, prefix="")
    shapes |= {"fc.weight": (h, h * n_aux), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    save(out, cfg, shapes, seed + 1)  # its own stream, independent of the target's tensors


# --------------------------------------------------------------------------------------------------- MLA
def _mla_config(arch: str, model_type: str) -> dict:
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
    cfg = _mla_config("DeepseekV2ForCausalLM", "deepseek_v2")
    save(out, cfg, _mla_shapes(cfg), seed)


def _glm_config() -> dict:
    cfg = _mla_config("Glm4MoeLiteForCausalLM", "glm4_moe_lite")
    # vLLM's Glm4MoeLite refuses a model without any MoE layer ("No Glm4MoE layer found in model.layers."),
    # so only the last layer is MoE. transformers reads mlp_layer_types, vLLM first_k_dense_replace.
    cfg["first_k_dense_replace"] = LAYERS - 1
    cfg["mlp_layer_types"] = ["dense"] * (LAYERS - 1) + ["sparse"]
    cfg["scoring_func"], cfg["topk_method"], cfg["norm_topk_prob"] = "sigmoid", "noaux_tc", True
    return cfg


def build_glm_mla(out: Path, seed: int = 0) -> None:
    cfg = _glm_config()
    shapes = _mla_shapes(cfg)
    h, e, i = cfg["hidden_size"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    p = f"model.layers.{LAYERS - 1}.mlp."
    for k in ("gate_proj", "up_proj", "down_proj"):
        del shapes[p + k + ".weight"]
    ffn = {"gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}
    shapes |= {p + "gate.weight": (e, h), p + "gate.e_score_correction_bias": (e,)}
    for x in range(e):
        shapes |= {f"{p}experts.{x}.{k}.weight": v for k, v in ffn.items()}
    si = i * cfg["n_shared_experts"]
    shapes |= {f"{p}shared_experts.{k}.weight": (si, h) if k != "down_proj" else (h, si) for k in ffn}
    save(out, cfg, shapes, seed)


# ------------------------------------------------------------------------------- shapes from transformers
def _transformers_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of `cfg`'s architecture as transformers lays it out (built on the meta device:
    no memory), for architectures whose checkpoint layout is long to write by hand (Gemma-3, NemotronH).
    Tied parameters appear once, as in a saved checkpoint."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return {name: tuple(param.shape) for name, param in model.named_parameters()}


# ------------------------------------------------------------------------------------ sliding window (Gemma)
# Regression class 8: `kv_cache_dtype_skip_layers: ["sliding_window"]` needs layers that have a window.
GEMMA_LAYER_TYPES = ["sliding_attention", "full_attention"] * (LAYERS // 2)  # Gemma-2's alternation: 0, 2 slide


def _gemma3_config() -> dict:
    cfg = {
        **common("Gemma3ForCausalLM", "gemma3_text"),
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "query_pre_attn_scalar": 64,
        "hidden_activation": "gelu_pytorch_tanh",
        "layer_types": GEMMA_LAYER_TYPES,
        # Shorter than max_model_len, so the window is real; a multiple of every block size seen (16, 32, 128).
        "sliding_window": 32,
        "rope_parameters": {
            "full_attention": dict(ROPE),
            "sliding_attention": dict(ROPE),
        },
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "tie_word_embeddings": True,  # as every Gemma checkpoint: no lm_head tensor
    }
    del cfg["hidden_act"], cfg["rope_theta"]
    return cfg


def build_gemma3(out: Path, seed: int = 0) -> None:
    cfg = _gemma3_config()
    save(out, cfg, _transformers_shapes(cfg), seed)


# ------------------------------------------------------------------------------- hybrid attention + Mamba-2
# Regression class 10: a model whose Mamba state shares the KV page pool with its attention layers.
NEMOTRON_H_PATTERN = "M*M*"  # Mamba-2, attention, Mamba-2, attention: layers 1 and 3 have a KV cache


def _nemotron_h_config() -> dict:
    cfg = {
        **common("NemotronHForCausalLM", "nemotron_h"),
        "hybrid_override_pattern": NEMOTRON_H_PATTERN,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "mamba_num_heads": 8,
        "mamba_head_dim": 32,  # 8 x 32 = 2 x hidden, Mamba-2's usual expansion
        # State 128 as the real Nemotron-H: the per-sequence state (~136 KiB at fp32) then outweighs an attention
        # page even at CPU's 128-token block, so it pins the shared page size (#55196) on every platform.
        "ssm_state_size": 128,
        "n_groups": 1,
        "conv_kernel": 4,
        "chunk_size": 64,
        "use_conv_bias": True,
        "use_bias": False,
        "mamba_hidden_act": "silu",
        "mlp_hidden_act": "relu2",
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-5,
        "residual_in_fp32": False,
    }
    del cfg["hidden_act"]
    return cfg


def build_nemotron_h(out: Path, seed: int = 0) -> None:
    cfg = _nemotron_h_config()
    save(out, cfg, _transformers_shapes(cfg), seed)


# ---------------------------------------------------------------------------------------------- EAGLE-3
EAGLE3_AUX_LAYERS = [1, 2, 3]  # the target's hidden states at these layers' inputs feed `fc`: any three of 4


def _eagle3_config() -> dict:
    t = _llama_config()
    return {
        **_draft_of_llama("LlamaForCausalLMEagle3", "llama"),
        "draft_vocab_size": VOCAB,  # the full vocab: no d2t / t2d mapping tensors needed
        "target_hidden_size": t["hidden_size"],
        # Nested, as some exported drafts write it: vLLM 0.26.0's GPU runner does not read this form
        # (reports/findings: eagle3-gpu-runner-ignores-nested-aux-layer-ids).
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": EAGLE3_AUX_LAYERS},
    }


def _eagle3_flat_config() -> dict:
    """The same draft with its layer ids at the top level, the form every runner reads: its cells reach the KV
    cache (class 6) where the nested form dies first."""
    cfg = {k: v for k, v in _eagle3_config().items() if k != "eagle_config"}
    return {**cfg, "eagle_aux_hidden_state_layer_ids": EAGLE3_AUX_LAYERS}


def build_eagle3_llama(out: Path, seed: int = 0, config: Callable[[], dict] = _eagle3_config) -> None:
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
    build_eagle3_llama(out, seed, _eagle3_flat_config)


# ------------------------------------------------------------------------------------- sparse MLA (GPU only)
def _deepseek_v32_config() -> dict:
    """DeepSeek-V3.2 (the family `fp8_ds_mla` exists for), shrunk to what ran on an H200 with vLLM 0.26.0
    (vllm-facts.md). Its sparse backends are CUDA-only and its dims (64 heads, index_topk 2048) make real
    weights pointless: the checkpoint is config + tokenizer and the registry loads it with load_format dummy."""
    return {
        **_mla_config("DeepseekV32ForCausalLM", "deepseek_v32"),
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
    write_json(out / "config.json", _deepseek_v32_config())
    write_json(out / "generation_config.json", {"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": False})
    write_tokenizer(out)


# -------------------------------------------------------------------------------------------------- API
BUILDERS: dict[str, Callable] = {
    "llama": build_llama,
    "ct_llama": build_ct_llama,
    "deepseek_v2": build_deepseek_v2,
    "glm_mla": build_glm_mla,
    "dflash_llama": build_dflash_llama,
    "gemma3": build_gemma3,
    "nemotron_h": build_nemotron_h,
    "eagle3_llama": build_eagle3_llama,
    "eagle3_llama_flat": build_eagle3_llama_flat,
    "deepseek_v32": build_deepseek_v32,
}
# Builders that write no weights (their registry entry loads them with load_format dummy).
CONFIG_ONLY = {"deepseek_v32"}
_CONFIGS = {
    "llama": _llama_config,
    "ct_llama": _llama_config,
    "dflash_llama": _dflash_config,
    "deepseek_v2": lambda: _mla_config("DeepseekV2ForCausalLM", "deepseek_v2"),
    "glm_mla": _glm_config,
    "gemma3": _gemma3_config,
    "nemotron_h": _nemotron_h_config,
    "eagle3_llama": _eagle3_config,
    "eagle3_llama_flat": _eagle3_flat_config,
    "deepseek_v32": _deepseek_v32_config,
}


def num_layers(name: str) -> int:
    """Decoder layers of the built checkpoint (a DFlash draft's own layers, numbered after its target's)."""
    return _CONFIGS[name]()["num_hidden_layers"]


_FAMILY = BuilderFamily(__name__, BUILDERS, also=("harness.models.checkpoint",))
folder_name = _FAMILY.folder_name
build = _FAMILY.build  # build(name, cache_dir, **options) -> checkpoint folder, built once

