"""Tiny models whose layers are not all alike: Gemma-3 (sliding-window and full-attention layers, for skip
rules that name `sliding_window`) and NemotronH (Mamba-2 layers sharing the KV page pool with attention ones).
Their checkpoint layout is long to write by hand, so parameter names and shapes come from transformers itself."""

from __future__ import annotations

from pathlib import Path

from kvmatrix.harness.models.checkpoint import LAYERS, ROPE, TORCH_DEFAULTS, common, save


# ------------------------------------------------------------------------------- shapes from transformers
def _transformers_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of `cfg`'s architecture as transformers lays it out (built on the meta device:
    no memory), for architectures whose checkpoint layout is long to write by hand (Gemma-3, NemotronH).
    Tied parameters appear once, as in a saved checkpoint."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**cfg)
    with TORCH_DEFAULTS, torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return {name: tuple(param.shape) for name, param in model.named_parameters()}


# ------------------------------------------------------------------------------------ sliding window (Gemma)
# Regression class 8: `kv_cache_dtype_skip_layers: ["sliding_window"]` needs layers that have a window.
GEMMA_LAYER_TYPES = ["sliding_attention", "full_attention"] * (LAYERS // 2)  # Gemma-2's alternation: 0, 2 slide


def gemma3_config() -> dict:
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
    cfg = gemma3_config()
    save(out, cfg, _transformers_shapes(cfg), seed)


# ------------------------------------------------------------------------------- hybrid attention + Mamba-2
# Regression class 10: a model whose Mamba state shares the KV page pool with its attention layers.
NEMOTRON_H_PATTERN = "M*M*"  # Mamba-2, attention, Mamba-2, attention: layers 1 and 3 have a KV cache


def nemotron_h_config() -> dict:
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
    cfg = nemotron_h_config()
    save(out, cfg, _transformers_shapes(cfg), seed)
