#!/usr/bin/env python3
# Written by `kvmatrix repro`: vLLM and torch only, every value below data. Exit status 0: vLLM does what EXPECTED
# says; an AssertionError: it does not, and the message says what it saw.
import fnmatch, functools, json, os, pathlib, re, tempfile, types  # noqa: E401

CELL = 'glm-ct-kv[kv=auto,skip=-,spec=-,exec=eager]'
GPU_CLASS = 'H200'
EXPECTED = "not_skipped layers resolve kv_cache_dtype in ['fp8'], k_scale in [0.5], v_scale in [0.5]"
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
CHECKS = [['kv_cache_dtype', ['layer.kv_cache_dtype'], ['index', 'not in', []], ['fp8']],
          ['k_scale', ['layer._k_scale_float', 'layer._k_scale'], ['index', 'not in', []], [0.5]],
          ['v_scale', ['layer._v_scale_float', 'layer._v_scale'], ['index', 'not in', []], [0.5]]]
PATHS = {'runner': ['model_runner', 'worker.model_runner'],
         'layers': ['vllm_config.compilation_config.static_forward_context']}

os.environ.update(ENV)  # before vLLM is imported: it reads its environment once
import torch, transformers, vllm  # noqa: E401, E402


def resolved(worker):  # inside the engine: each attention layer (numbered by the first number in its name) with
    first = lambda obj, paths: next((v for v in (functools.reduce(lambda o, a: getattr(o, a, None), p.split("."), obj)
                                                 for p in paths) if v is not None), None)  # noqa: E731
    runner, layers = first(worker, PATHS["runner"]), []  # the values CHECKS name, as kvmatrix's record reads them
    for name, layer in [(n, m) for n, m in first(runner, PATHS["layers"]).items() if hasattr(m, "kv_cache_dtype")]:
        number, at = re.search(r"(?:^|\.)(\d+)(?:\.|$)", name), types.SimpleNamespace(layer=layer)
        row = {"name": name, "index": number and int(number[1]), "role": "target"}
        layers.append(row | {field: str(first(at, paths)) for field, paths, *_ in CHECKS if paths})
    return layers


arch = transformers.AutoConfig.for_model(**{k: v for k, v in CONFIG.items() if k != "quantization_config"})
hf, model = transformers.AutoModelForCausalLM.from_config(arch, dtype=torch.bfloat16), tempfile.mkdtemp()
scalars = {p.format(i): torch.tensor(v) for p, v, (first, end) in SCALARS for i in range(first, end)}  # its KV scales
hf.save_pretrained(model, state_dict=hf.state_dict() | scalars)
pathlib.Path(model, "config.json").write_text(json.dumps(CONFIG))  # the checkpoint's own, its quantization included
state = vllm.LLM(model=model, **ENGINE_ARGS).collective_rpc(resolved)[0]
chosen = lambda key, op, values: [la for la in state if (la[key] in values) == (op == "in")]  # noqa: E731 - as judged
wrong = [f"no layer with {' '.join(map(str, select))}" for _, _, select, _ in CHECKS if not chosen(*select)]
wrong += [f"layer {la['name']}: {field} {la[field]!r}" for field, _, select, wanted in CHECKS  # each wanted a glob
          for la in chosen(*select) if not any(fnmatch.fnmatchcase(la[field], str(w)) for w in wanted)]
assert not wrong, f"expected {EXPECTED}; observed: {wrong}"
print("OK:", EXPECTED)
