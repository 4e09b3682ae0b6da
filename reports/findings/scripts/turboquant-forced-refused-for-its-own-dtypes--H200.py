#!/usr/bin/env python3
# Written by `kvmatrix repro`: vLLM and torch only, every value below data. Exit status 0: vLLM does what EXPECTED
# says; an AssertionError: it does not, and the message says what it saw.
import json, os, tempfile, traceback  # noqa: E401

CELL = 'surface-turboquant[kv=turboquant_k8v4,skip=-,spec=-,attn=TURBOQUANT]'
GPU_CLASS = 'H200'
EXPECTED = 'the engine starts and generates'
ENV = {'VLLM_ENABLE_V1_MULTIPROCESSING': '0'}
CONFIG = {'architectures': ['LlamaForCausalLM'], 'bos_token_id': 0, 'eos_token_id': 1, 'head_dim': 64,
          'hidden_size': 128, 'intermediate_size': 256, 'max_position_embeddings': 512, 'model_type': 'llama',
          'num_attention_heads': 4, 'num_hidden_layers': 4, 'num_key_value_heads': 2, 'pad_token_id': 2,
          'rope_theta': 10000.0, 'torch_dtype': 'bfloat16', 'vocab_size': 320}
ENGINE_ARGS = {'dtype': 'bfloat16', 'max_model_len': 256, 'enforce_eager': False,
               'kv_cache_memory_bytes': 1073741824, 'gpu_memory_utilization': 0.05,
               'kv_cache_dtype': 'turboquant_k8v4', 'attention_config': {'backend': 'TURBOQUANT'},
               'compilation_config': {'mode': 3, 'cudagraph_capture_sizes': [1, 2, 4, 8]}, 'load_format': 'dummy',
               'skip_tokenizer_init': True}
PROMPTS = [[0, 55, 261, 276, 68, 83, 290, 278, 283, 73, 224, 41, 85, 68, 312, 72, 224, 289],
           [0, 20, 224, 21, 224, 22, 224, 23, 224, 24]]
SAMPLING = {'temperature': 0.0, 'max_tokens': 8, 'ignore_eos': True, 'detokenize': False}

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
assert error is None, f"expected {EXPECTED}; observed: {error}"
print("OK:", EXPECTED)
