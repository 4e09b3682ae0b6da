#!/usr/bin/env python3
# Written by `kvmatrix repro`: vLLM and torch only, every value below data. Exit status 0: vLLM does what EXPECTED
# says; an AssertionError: it does not, and the message says what it saw.
import json, os, tempfile, traceback  # noqa: E401

CELL = 'glm-ct-kv[kv=auto,skip=-,spec=-,exec=eager]'
GPU_CLASS = 'H200'
EXPECTED = 'the engine starts and generates'
ENV = {'VLLM_ENABLE_V1_MULTIPROCESSING': '0'}
CONFIG = {'architectures': ['Glm4MoeLiteForCausalLM'], 'first_k_dense_replace': 3, 'hidden_size': 128,
          'intermediate_size': 256, 'max_position_embeddings': 512,
          'mlp_layer_types': ['dense', 'dense', 'dense', 'sparse'], 'model_type': 'glm4_moe_lite',
          'moe_intermediate_size': 64, 'moe_layer_freq': 1, 'n_routed_experts': 4, 'num_attention_heads': 4,
          'num_experts_per_tok': 2, 'num_hidden_layers': 4, 'num_key_value_heads': 4, 'num_nextn_predict_layers': 1,
          'pad_token_id': 2, 'q_lora_rank': 64, 'qk_nope_head_dim': 128,
          'quantization_config': {'config_groups': {}, 'format': 'dense', 'ignore': ['lm_head'],
                                  'kv_cache_scheme': {'dynamic': False, 'num_bits': 8, 'strategy': 'tensor',
                                                      'symmetric': True, 'type': 'float'},
                                  'quant_method': 'compressed-tensors', 'quantization_status': 'compressed'},
          'rms_norm_eps': 1e-06, 'rope_theta': 10000.0, 'routed_scaling_factor': 1.0, 'scoring_func': 'sigmoid',
          'topk_method': 'noaux_tc', 'torch_dtype': 'bfloat16', 'v_head_dim': 128, 'vocab_size': 320}
SCALARS = [['model.layers.{}.self_attn.k_scale', 0.5, [0, 5]], ['model.layers.{}.self_attn.v_scale', 0.5, [0, 5]]]
ENGINE_ARGS = {'dtype': 'bfloat16', 'max_model_len': 256, 'enforce_eager': True,
               'kv_cache_memory_bytes': 1073741824, 'gpu_memory_utilization': 0.05, 'kv_cache_dtype': 'auto',
               'skip_tokenizer_init': True}
PROMPTS = [[0, 55, 261, 276, 68, 83, 290, 278, 283, 73, 224, 41, 85, 68, 312, 72, 224, 289],
           [0, 20, 224, 21, 224, 22, 224, 23, 224, 24]]
SAMPLING = {'temperature': 0.0, 'max_tokens': 8, 'ignore_eos': True, 'detokenize': False}

os.environ.update(ENV)  # before vLLM is imported: it reads its environment once
import vllm  # noqa: E402
import torch, transformers  # noqa: E401, E402


plain = {k: v for k, v in CONFIG.items() if k != "quantization_config"}  # transformers would quantize
plain["initializer_range"] = CONFIG["hidden_size"] ** -0.5
torch.manual_seed(0)
hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**plain), dtype=torch.bfloat16)
model = tempfile.mkdtemp()
scalars = {p.format(i): torch.tensor(v) for p, v, (first, end) in SCALARS for i in range(first, end)}
hf.save_pretrained(model, state_dict=hf.state_dict() | scalars)  # the checkpoint's own scalars (its KV scales)
with open(os.path.join(model, "config.json"), "w") as f:  # the checkpoint's own, its quantization included
    json.dump(CONFIG, f)
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
