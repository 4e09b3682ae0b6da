"""Tiny local HF-format checkpoints that real vLLM loads, built deterministically and offline.

The matrix needs real (random but fixed) weights rather than `load_format="dummy"`: a `kv_cache_scheme`
checkpoint needs positive `k_scale`/`v_scale` tensors, and a DFlash draft must pair with a real target.
Every builder writes config.json, a byte-level BPE tokenizer trained here on a fixed corpus, and bf16
safetensors whose tensors are drawn from a generator seeded by (seed, tensor name), so the bytes depend on
neither dict order nor what was built before (harness/models/checkpoint.py). This module is the registry of
builders by name; the architectures live by family in tiny_llama.py, tiny_mla.py, tiny_glm_fp8.py,
tiny_mixed_layers.py and tiny_drafts.py.

    path = build("ct_llama", cache_dir, k_scale=1e-4)   # folder with config.json, tokenizer, weights
"""

from __future__ import annotations

from collections.abc import Callable

from kvmatrix.harness.models.cache import BuilderFamily
from kvmatrix.harness.models.tiny_drafts import (
    build_dflash_llama_mha,
    build_eagle3_llama_gqa4,
    build_llama_draft_small,
    dflash_mha_config,
    eagle3_gqa4_config,
    llama_draft_small_config,
)
from kvmatrix.harness.models.tiny_glm_fp8 import (
    build_glm5_fp8,
    build_glm_ct_kv,
    build_glm_fp8,
    glm5_fp8_config,
    glm_ct_kv_config,
    glm_fp8_config,
)
from kvmatrix.harness.models.tiny_llama import (
    build_ct_llama,
    build_dflash_llama,
    build_eagle3_llama,
    build_eagle3_llama_flat,
    build_llama,
    dflash_config,
    eagle3_config,
    eagle3_flat_config,
    llama_config,
)
from kvmatrix.harness.models.tiny_mixed_layers import build_gemma3, build_nemotron_h, gemma3_config, nemotron_h_config
from kvmatrix.harness.models.tiny_mla import (
    build_deepseek_v2,
    build_deepseek_v32,
    build_glm_mla,
    deepseek_v32_config,
    glm_config,
    mla_config,
)

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
    "glm_fp8": build_glm_fp8,
    "glm_ct_kv": build_glm_ct_kv,
    "glm5_fp8": build_glm5_fp8,
    "eagle3_llama_gqa4": build_eagle3_llama_gqa4,
    "dflash_llama_mha": build_dflash_llama_mha,
    "llama_draft_small": build_llama_draft_small,
}
# Builders that write no weights (their registry entry loads them with load_format dummy).
CONFIG_ONLY = {"deepseek_v32", "glm5_fp8"}
_CONFIGS = {
    "llama": llama_config,
    "ct_llama": llama_config,
    "dflash_llama": dflash_config,
    "deepseek_v2": lambda: mla_config("DeepseekV2ForCausalLM", "deepseek_v2"),
    "glm_mla": glm_config,
    "gemma3": gemma3_config,
    "nemotron_h": nemotron_h_config,
    "eagle3_llama": eagle3_config,
    "eagle3_llama_flat": eagle3_flat_config,
    "deepseek_v32": deepseek_v32_config,
    "glm_fp8": glm_fp8_config,
    "glm_ct_kv": glm_ct_kv_config,
    "glm5_fp8": glm5_fp8_config,
    "eagle3_llama_gqa4": eagle3_gqa4_config,
    "dflash_llama_mha": dflash_mha_config,
    "llama_draft_small": llama_draft_small_config,
}


def num_layers(name: str) -> int:
    """Decoder layers of the built checkpoint (a DFlash draft's own layers, numbered after its target's)."""
    return _CONFIGS[name]()["num_hidden_layers"]


def layers_of(name: str, draft_method: str | None = None) -> int | None:
    """The attention layers a registry entry brings to an engine, for checking skip-layer indices: a target's
    decoder layers, a draft's own (numbered after its target's; an MTP draft is the checkpoint's MTP layers).
    None for a builder without a fixed config (the trained family)."""
    if name not in _CONFIGS:
        return None
    config = _CONFIGS[name]()
    return config.get("num_nextn_predict_layers", 1) if draft_method == "mtp" else config["num_hidden_layers"]


# The cache folder's fingerprint covers every module a build runs through: editing any of them rebuilds.
_FAMILY = BuilderFamily(__name__, BUILDERS, also=(
    "kvmatrix.harness.models.tiny_llama", "kvmatrix.harness.models.tiny_mla", "kvmatrix.harness.models.tiny_glm_fp8",
    "kvmatrix.harness.models.tiny_mixed_layers", "kvmatrix.harness.models.tiny_drafts",
    "kvmatrix.harness.models.checkpoint"))
folder_name = _FAMILY.folder_name
build = _FAMILY.build  # build(name, cache_dir, **options) -> checkpoint folder, built once
