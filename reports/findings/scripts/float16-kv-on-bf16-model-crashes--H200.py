#!/usr/bin/env python3
# Written by `kvmatrix repro`: vLLM and torch only, every value below data. Exit status 0: vLLM does what EXPECTED
# says; an AssertionError: it does not, and the message says what it saw.
import json, os, re, tempfile, traceback  # noqa: E401

CELL = 'deepseek-mla[kv=float16,skip=-,spec=-,exec=eager]'
GPU_CLASS = 'H200'
EXPECTED = 'the engine starts and generates, or refuses at start in words the case accepts'
ENV = {'VLLM_ENABLE_V1_MULTIPROCESSING': '0'}
CONFIG = {'architectures': ['DeepseekV2ForCausalLM'], 'bos_token_id': 0, 'eos_token_id': 1,
          'first_k_dense_replace': 4, 'hidden_size': 128, 'intermediate_size': 256, 'max_position_embeddings': 512,
          'model_type': 'deepseek_v2', 'moe_intermediate_size': 64, 'moe_layer_freq': 1, 'n_group': 1,
          'n_routed_experts': 4, 'n_shared_experts': 1, 'num_attention_heads': 4, 'num_experts_per_tok': 2,
          'num_hidden_layers': 4, 'num_key_value_heads': 4, 'pad_token_id': 2, 'q_lora_rank': None,
          'rope_theta': 10000.0, 'scoring_func': 'softmax', 'topk_group': 1, 'torch_dtype': 'bfloat16',
          'vocab_size': 320}
ENGINE_ARGS = {'dtype': 'bfloat16', 'max_model_len': 256, 'enforce_eager': True,
               'kv_cache_memory_bytes': 1073741824, 'gpu_memory_utilization': 0.05, 'kv_cache_dtype': 'float16',
               'load_format': 'dummy', 'skip_tokenizer_init': True}
PROMPTS = [[0, 55, 261, 276, 68, 83, 290, 278, 283, 73, 224, 41, 85, 68, 312, 72, 224, 289],
           [0, 20, 224, 21, 224, 22, 224, 23, 224, 24]]
SAMPLING = {'temperature': 0.0, 'max_tokens': 8, 'ignore_eos': True, 'detokenize': False}
REFUSALS = ['kv_cache_dtype=\\W?\\w+\\W? is incompatible with dtype']
REFUSAL_REQUIRED = False

os.environ.update(ENV)  # before vLLM is imported: it reads its environment once
import vllm  # noqa: E402


model = tempfile.mkdtemp()  # config.json alone: vLLM draws the weights (load_format dummy)
with open(os.path.join(model, "config.json"), "w") as f:
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
refused = error is not None and any(re.search(p, error, re.IGNORECASE) for p in REFUSALS)
observed = error or "it started, and no refusal"
assert refused or (error is None and not REFUSAL_REQUIRED), f"expected {EXPECTED}; observed: {observed}"
print("OK:", EXPECTED)
