#!/usr/bin/env python3
# Written by `kvmatrix repro`: vLLM and torch only, every value below data. Exit status 0: vLLM does what EXPECTED
# says; an AssertionError: it does not, and the message says what it saw.
import gc, json, os, tempfile  # noqa: E401

CELL = 'execution-modes[kv=auto,skip=-,spec=-,exec=graphs_full,wl=plain]'
GPU_CLASS = 'H200'
EXPECTED = "the greedy tokens equal the eager oracle's, or part at a near tie"
ENV = {'VLLM_ENABLE_V1_MULTIPROCESSING': '0'}
CONFIG = {'architectures': ['LlamaForCausalLM'], 'bos_token_id': 0, 'eos_token_id': 1, 'head_dim': 64,
          'hidden_size': 128, 'intermediate_size': 256, 'max_position_embeddings': 512, 'model_type': 'llama',
          'num_attention_heads': 4, 'num_hidden_layers': 4, 'num_key_value_heads': 2, 'pad_token_id': 2,
          'rope_theta': 10000.0, 'torch_dtype': 'bfloat16', 'vocab_size': 320}
ENGINE_ARGS = {'dtype': 'bfloat16', 'max_model_len': 512, 'enforce_eager': False,
               'kv_cache_memory_bytes': 1073741824, 'gpu_memory_utilization': 0.05, 'kv_cache_dtype': 'auto',
               'compilation_config': {'mode': 3, 'cudagraph_mode': 'FULL', 'cudagraph_capture_sizes': [1, 2, 4, 8]},
               'skip_tokenizer_init': True}
PROMPTS = [[0, 55, 261, 276, 68, 83, 290, 278, 283, 73, 224, 41, 85, 68, 312, 72, 224, 289],
           [0, 20, 224, 21, 224, 22, 224, 23, 224, 24]]
SAMPLING = {'temperature': 0.0, 'max_tokens': 8, 'ignore_eos': True, 'detokenize': False, 'logprobs': 5}
ORACLE_ENGINE_ARGS = {'dtype': 'bfloat16', 'max_model_len': 512, 'enforce_eager': True,
                      'kv_cache_memory_bytes': 1073741824, 'gpu_memory_utilization': 0.05, 'kv_cache_dtype': 'auto',
                      'skip_tokenizer_init': True}
TIE_TOLERANCE = 0.1

os.environ.update(ENV)  # before vLLM is imported: it reads its environment once
import vllm  # noqa: E402
import torch, transformers  # noqa: E401, E402
from vllm.distributed.parallel_state import cleanup_dist_env_and_memory  # noqa: E402


def greedy(args):
    """Each sequence's greedy tokens, each with the top logprobs where it was chosen (an engine at a time)."""
    gc.collect()  # the engine of the call before, if any, torn down first
    cleanup_dist_env_and_memory()
    outputs = vllm.LLM(model=model, **args).generate([{"prompt_token_ids": p} for p in PROMPTS],
                                                     vllm.SamplingParams(**SAMPLING))
    return [[(t, {k: v.logprob for k, v in p.items()}) for t, p in zip(c.token_ids, c.logprobs)]
            for c in (o.outputs[0] for o in outputs)]


plain = dict(CONFIG, initializer_range=CONFIG["hidden_size"] ** -0.5)
torch.manual_seed(0)
hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**plain), dtype=torch.bfloat16)
model = tempfile.mkdtemp()
hf.save_pretrained(model)
far = []
for s, (mine, theirs) in enumerate(zip(greedy(ENGINE_ARGS), greedy(ORACLE_ENGINE_ARGS))):
    at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a[0] != b[0]), None)
    if at is not None:  # a near tie: either run's choice within TIE_TOLERANCE of the other's (else of its last top-k)
        (a, a_lp), (b, b_lp) = mine[at], theirs[at]
        gap = min(a_lp[a] - a_lp.get(b, min(a_lp.values())), b_lp[b] - b_lp.get(a, min(b_lp.values())))
        print(f"sequence {s}: first divergent token {at}: eager {b}, this run {a}, tie gap {gap:.3f}")
        far += [s] if gap > TIE_TOLERANCE else []
assert not far, f"expected {EXPECTED}; sequences {far} diverge with no near tie (tie gap > {TIE_TOLERANCE})"
print("OK:", EXPECTED)
