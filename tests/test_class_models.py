"""The tiny models behind regression classes 6, 7 (sparse), 8 and 10: what makes each one fit its class.

Whether vLLM runs them is what their case files check (cases/gemma3-sliding-skip.yaml, nemotron-h-hybrid.yaml,
llama-eagle3.yaml; deepseek-v32-sparse-mla.yaml is GPU-only); here, without vLLM, the checkpoints themselves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvmatrix.harness.models import tiny as tm  # noqa: E402
from kvmatrix.harness.models.tiny_llama import llama_config  # noqa: E402


def _config(name: str, cache: Path) -> dict:
    return json.loads((tm.build(name, cache) / "config.json").read_text())


@pytest.mark.parametrize("name", ["gemma3", "nemotron_h"])
def test_transformers_loads_every_tensor(name, tmp_path):
    """Names and shapes come from transformers' own layout: loading reports nothing missing or unexpected."""
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(tm.build(name, tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_gemma3_has_sliding_and_full_layers(tmp_path):
    cfg = _config("gemma3", tmp_path)
    # The case selects layers [0, 2] as sliding and [1, 3] as full: the config must say the same.
    assert cfg["layer_types"] == ["sliding_attention", "full_attention"] * 2
    assert cfg["sliding_window"] < 256  # below the harness's max_model_len: the window is real


def test_nemotron_h_state_outweighs_an_attention_page(tmp_path):
    cfg = _config("nemotron_h", tmp_path)
    assert [i for i, c in enumerate(cfg["hybrid_override_pattern"]) if c == "*"] == [1, 3]
    ssm = cfg["mamba_num_heads"] * cfg["mamba_head_dim"] * cfg["ssm_state_size"] * 4  # fp32 state
    attn_page_bf16 = 128 * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2  # CPU block 128, K and V
    assert ssm > attn_page_bf16  # else the state would not pin the page (class 10's point)


def test_eagle3_draft_fits_the_llama_target(tmp_path):
    from safetensors import safe_open

    draft, target = _config("eagle3_llama", tmp_path), llama_config()
    assert draft["target_hidden_size"] == target["hidden_size"] and draft["draft_vocab_size"] == target["vocab_size"]
    assert max(draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"]) < target["num_hidden_layers"]
    with safe_open(tm.build("eagle3_llama", tmp_path) / "model.safetensors", "pt") as f:
        assert "model.embed_tokens.weight" not in f.keys()  # shared with the target
        assert list(f.get_slice("midlayer.self_attn.q_proj.weight").get_shape()) == [256, 2 * 128]


def test_eagle3_drafts_differ_only_in_where_the_layer_ids_stand(tmp_path):
    nested, flat = _config("eagle3_llama", tmp_path), _config("eagle3_llama_flat", tmp_path)
    ids = flat.pop("eagle_aux_hidden_state_layer_ids")
    assert ids == nested.pop("eagle_config")["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert flat == nested


def test_sparse_mla_is_config_only(tmp_path):
    folder = tm.build("deepseek_v32", tmp_path)
    cfg = _config("deepseek_v32", tmp_path)
    assert not (folder / "model.safetensors").exists() and "deepseek_v32" in tm.CONFIG_ONLY
    assert cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] == 576 and cfg["index_topk"] == 2048


def test_glm_fp8_is_a_compressed_tensors_fp8_checkpoint_with_kv_scales_and_mtp(tmp_path):
    """Every linear of the decoder and MTP layers is float8_e4m3fn with a per-output-channel scale that gives back
    the bf16 draw; routers, the MTP projections and the head stay bf16; each attention carries k/v scales."""
    import torch
    from safetensors import safe_open

    from kvmatrix.harness.models.checkpoint import weights
    from kvmatrix.harness.models.tiny_glm_fp8 import GLM_FP8_K_SCALE, MTP_LAYER, _glm_fp8_shapes, glm_fp8_config

    cfg = _config("glm_fp8", tmp_path)
    scheme = cfg["quantization_config"]
    assert scheme["quant_method"] == "compressed-tensors" and scheme["kv_cache_scheme"]["strategy"] == "tensor"
    assert scheme["config_groups"]["group_0"]["weights"]["strategy"] == "channel"
    assert cfg["num_nextn_predict_layers"] == 1 and MTP_LAYER == cfg["num_hidden_layers"]
    drawn = weights(_glm_fp8_shapes(glm_fp8_config()), 0)
    with safe_open(tm.build("glm_fp8", tmp_path) / "model.safetensors", "pt") as f:
        names = set(f.keys())
        fp8 = {n for n in names if f.get_slice(n).get_dtype() == "F8_E4M3"}
        for name in fp8:
            scale = f.get_tensor(name + "_scale")
            assert scale.shape == (f.get_slice(name).get_shape()[0], 1)
            back = f.get_tensor(name).float() * scale
            assert torch.allclose(back, drawn[name].float(), rtol=0.07, atol=1e-3), name
        assert {n + "_scale" for n in fp8} | fp8 <= names
        bf16_2d = {n for n in names - fp8 if n.endswith(".weight") and len(f.get_slice(n).get_shape()) == 2}
        assert {n.split(".")[-2] for n in bf16_2d if n.startswith("model.layers.")} == {"gate", "eh_proj", "head"}
        for n in range(MTP_LAYER + 1):
            assert f.get_tensor(f"model.layers.{n}.self_attn.k_scale").item() == GLM_FP8_K_SCALE
        assert f"model.layers.{MTP_LAYER}.self_attn.kv_a_proj_with_mqa.weight" in fp8
        assert {f"model.layers.{MTP_LAYER}.{k}.weight" for k in ("enorm", "hnorm", "shared_head.norm")} <= names


def test_glm5_fp8_is_config_only_in_the_deepseek_v3_block_format(tmp_path):
    folder = tm.build("glm5_fp8", tmp_path)
    cfg = _config("glm5_fp8", tmp_path)
    assert not (folder / "model.safetensors").exists() and "glm5_fp8" in tm.CONFIG_ONLY
    assert cfg["architectures"] == ["GlmMoeDsaForCausalLM"] and cfg["model_type"] == "glm_moe_dsa"
    assert cfg["quantization_config"] == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                          "weight_block_size": [128, 128]}
    assert cfg["num_nextn_predict_layers"] == 1 and "index_topk" in cfg
