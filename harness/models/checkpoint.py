"""What every tiny checkpoint shares: the fixed sizes and special tokens, a byte-level BPE tokenizer trained on
a fixed corpus, and bf16 weights drawn from a generator seeded by (seed, tensor name), written as safetensors
with config.json; plus the config and tensor shapes common to the decoder architectures (tiny_*.py)."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

VOCAB = 320
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<mask>"]  # ids 0..3, fixed by training order
BOS, EOS, PAD, MASK = range(4)
HIDDEN, LAYERS, INTERMEDIATE, MAX_POS = 128, 4, 256, 512
ROPE = {"rope_type": "default", "rope_theta": 10000.0}

# The tokenizer's training text: fixed, so its merges (and so the vocab) never change.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A key value cache stores the keys and values of past tokens.
vLLM pages the cache into blocks; each block holds sixteen tokens of every layer. Quantised caches keep
eight bit floats with a per tensor scale, and attention reads them back in the model's own precision.
Once upon a time there was a small model that could count: one, two, three, four, five, six, seven, eight,
nine, ten. It liked numbers 0123456789 and punctuation (like this!) and questions? Yes: it answered them.
def add(a, b):\n    return a + b\nprint(add(2, 3))\n
Speculative decoding lets a draft propose tokens that the target verifies in one pass.
"""


# ---------------------------------------------------------------------------------------------- tokenizer
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: any text encodes
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer)
    # Llama-style prompts start with BOS; vLLM and AutoTokenizer both honour the post-processor.
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    return tok


def write_tokenizer(out: Path) -> None:
    tokenizer().save(str(out / "tokenizer.json"))
    names = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    write_json(out / "special_tokens_map.json", names)
    write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": MAX_POS,
            **names,
            "add_bos_token": True,
            "clean_up_tokenization_spaces": False,
        },
    )


# ------------------------------------------------------------------------------------------------ weights
def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


# torch's process-wide defaults (the default dtype, the global generator) are shared by the threads a run builds
# models in, and transformers sets the default dtype while it builds a model from a config: code that builds a
# torch model holds this lock. Weights are drawn with their own generator and an explicit dtype, and need none
# (drawn while another thread's transformers build had set bfloat16, three Nemotron-H tensors came out unlike a
# lone build's).
TORCH_DEFAULTS = threading.Lock()


def weights(shapes: dict[str, tuple[int, ...]], seed: int):
    """bf16 tensors: norms are ones; matrices are N(0, 1/fan_in) so activations stay O(1) through the layers
    (with the usual 0.02 the residual stream would swamp attention and KV precision would never show)."""
    import torch

    out = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=torch.bfloat16)
            continue
        if name.endswith("e_score_correction_bias"):  # router bias: fp32 zeros, as real GLM checkpoints
            out[name] = torch.zeros(shape, dtype=torch.float32)
            continue
        digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        std = 1.0 if "embed_tokens" in name else shape[-1] ** -0.5
        out[name] = (torch.randn(shape, generator=gen, dtype=torch.float32) * std).to(torch.bfloat16)
    return out


def per_channel_fp8(tensors: dict, names: list[str]) -> dict:
    """`names` as float8_e4m3fn with a float32 per-output-channel `weight_scale` each, as compressed-tensors writes
    a `strategy: channel` FP8 weight; the other tensors unchanged. Self-contained: standalone scripts inline it."""
    import torch

    fp8_max = 448.0  # largest float8_e4m3fn value
    out = dict(tensors)
    for name in names:
        w32 = out[name].float()
        scale = (w32.abs().amax(dim=1, keepdim=True) / fp8_max).clamp(min=1e-12)
        out[name] = (w32 / scale).to(torch.float8_e4m3fn)
        out[name.removesuffix("weight") + "weight_scale"] = scale
    return out


def save(out: Path, config: dict, shapes: dict, seed: int, extra=None) -> None:
    from safetensors.torch import save_file

    tensors = weights(shapes, seed)
    tensors.update(extra or {})
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", {"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": False})
    write_tokenizer(out)


# ------------------------------------------------------------------------------------ a quantized KV cache
# compressed-tensors' declaration of a static per-tensor FP8 KV cache (llm-compressor's `kv_cache_scheme`).
STATIC_FP8_KV_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


def kv_only_quantization() -> dict:
    """The quantization_config of a compressed-tensors checkpoint that quantizes nothing but its KV cache."""
    return {"quant_method": "compressed-tensors", "format": "dense", "quantization_status": "compressed",
            "config_groups": {}, "ignore": ["lm_head"], "kv_cache_scheme": dict(STATIC_FP8_KV_SCHEME)}


def static_kv_scales(layers: int, k_scale: float, v_scale: float) -> dict:
    """The scheme's scales, where llm-compressor puts them: a float32 `self_attn.k_scale` / `v_scale` scalar for each
    of the first `layers` layers."""
    import torch

    if not (k_scale > 0 and v_scale > 0):
        raise ValueError("k_scale and v_scale must be positive (vLLM rejects others on the FP8 path)")
    scales = {}
    for n in range(layers):
        scales[f"model.layers.{n}.self_attn.k_scale"] = torch.tensor(k_scale, dtype=torch.float32)
        scales[f"model.layers.{n}.self_attn.v_scale"] = torch.tensor(v_scale, dtype=torch.float32)
    return scales


def common(arch: str, model_type: str, layers: int = LAYERS) -> dict:
    return {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers,
        "max_position_embeddings": MAX_POS,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": ROPE["rope_theta"],
        "rope_parameters": dict(ROPE),
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "attention_bias": False,
    }


def layer_shapes(cfg: dict, attn: dict[str, tuple[int, ...]], prefix: str = "model.") -> dict:
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {}
    for n in range(cfg["num_hidden_layers"]):
        p = f"{prefix}layers.{n}."
        shapes.update({f"{p}self_attn.{k}.weight": v for k, v in attn.items()})
        shapes.update(
            {
                f"{p}mlp.gate_proj.weight": (i, h),
                f"{p}mlp.up_proj.weight": (i, h),
                f"{p}mlp.down_proj.weight": (h, i),
                f"{p}input_layernorm.weight": (h,),
                f"{p}post_attention_layernorm.weight": (h,),
            }
        )
    return shapes


def head_shapes(cfg: dict) -> dict:
    v, h = cfg["vocab_size"], cfg["hidden_size"]
    return {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
