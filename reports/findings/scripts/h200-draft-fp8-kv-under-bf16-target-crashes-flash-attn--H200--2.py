#!/usr/bin/env python3
# Written by `kvmatrix repro`: vLLM and torch only, every value below data. Exit status 0: vLLM does what EXPECTED
# says; an AssertionError: it does not, and the message says what it saw.
import json, os, tempfile, traceback  # noqa: E401

CELL = 'spec-draft-backends[kv=auto,skip=-,spec=llama-dflash,dkv=fp8,dattn=-,exec=eager]'
GPU_CLASS = 'H200'
EXPECTED = 'the engine starts and generates'
ENV = {'VLLM_ENABLE_V1_MULTIPROCESSING': '0', 'VLLM_USE_FLASHINFER_SAMPLER': '0'}
CONFIG = {'architectures': ['LlamaForCausalLM'], 'bos_token_id': 0, 'eos_token_id': 1, 'head_dim': 64,
          'hidden_size': 128, 'intermediate_size': 256, 'max_position_embeddings': 512, 'model_type': 'llama',
          'num_attention_heads': 4, 'num_hidden_layers': 4, 'num_key_value_heads': 2, 'pad_token_id': 2,
          'rope_theta': 10000.0, 'torch_dtype': 'bfloat16', 'vocab_size': 320}
DRAFT_CONFIG = CONFIG | {'architectures': ['DFlashDraftModel'], 'block_size': 4,
                         'dflash_config': {'mask_token_id': 3, 'target_layer_ids': [0, 2]}, 'model_type': 'qwen3',
                         'num_hidden_layers': 1, 'num_target_layers': 4}
DRAFT_TENSORS = {'fc.weight': [128, 256], 'hidden_norm.weight': [128], 'layers.0.input_layernorm.weight': [128],
                 'layers.0.mlp.down_proj.weight': [128, 256], 'layers.0.mlp.gate_proj.weight': [256, 128],
                 'layers.0.mlp.up_proj.weight': [256, 128], 'layers.0.post_attention_layernorm.weight': [128],
                 'layers.0.self_attn.k_norm.weight': [64], 'layers.0.self_attn.k_proj.weight': [128, 128],
                 'layers.0.self_attn.o_proj.weight': [128, 256], 'layers.0.self_attn.q_norm.weight': [64],
                 'layers.0.self_attn.q_proj.weight': [256, 128], 'layers.0.self_attn.v_proj.weight': [128, 128],
                 'norm.weight': [128]}
ENGINE_ARGS = {'dtype': 'bfloat16', 'max_model_len': 256, 'enforce_eager': True,
               'kv_cache_memory_bytes': 1073741824, 'gpu_memory_utilization': 0.05, 'kv_cache_dtype': 'auto',
               'speculative_config': {'method': 'dflash', 'model': '@DRAFT@', 'num_speculative_tokens': 3,
                                      'kv_cache_dtype': 'fp8'},
               'disable_log_stats': False, 'skip_tokenizer_init': True}
PROMPTS = [[0, 55, 261, 276, 68, 83, 290, 278, 283, 73, 224, 41, 85, 68, 312, 72, 224, 289],
           [0, 20, 224, 21, 224, 22, 224, 23, 224, 24]]
SAMPLING = {'temperature': 0.0, 'max_tokens': 8, 'ignore_eos': True, 'detokenize': False}

os.environ.update(ENV)  # before vLLM is imported: it reads its environment once
import vllm  # noqa: E402
import safetensors.torch, torch, transformers  # noqa: E401, E402


plain = dict(CONFIG, initializer_range=CONFIG["hidden_size"] ** -0.5)
torch.manual_seed(0)
hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**plain), dtype=torch.bfloat16)
model = tempfile.mkdtemp()
hf.save_pretrained(model)
draft = tempfile.mkdtemp()  # the draft's config.json and tensors of its shapes drawn at random (it loads them itself)
with open(os.path.join(draft, "config.json"), "w") as f:
    json.dump(DRAFT_CONFIG, f)
tensors = {name: torch.randn(shape, dtype=torch.bfloat16) * 0.02 for name, shape in DRAFT_TENSORS.items()}
safetensors.torch.save_file(tensors, os.path.join(draft, "model.safetensors"), metadata={"format": "pt"})
ENGINE_ARGS["speculative_config"]["model"] = draft
error = None
try:
    llm = vllm.LLM(model=model, **ENGINE_ARGS)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], vllm.SamplingParams(**SAMPLING))
    print("greedy token ids:", [list(o.outputs[0].token_ids) for o in outputs])
except Exception as err:  # noqa: BLE001 - the exception is what this script observes, with where vLLM raised it
    site = [f"{f.filename.rsplit('vllm/', 1)[-1]}:{f.lineno} {f.name}" for f in traceback.extract_tb(err.__traceback__)
            if "/vllm/" in f.filename]
    error = f"{type(err).__name__}: {err} (raised at {site[-1] if site else '?'})"
print("observed:", error or "no exception")
assert error is None, f"expected {EXPECTED}; observed: {error}"
print("OK:", EXPECTED)
