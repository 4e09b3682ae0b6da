#!/usr/bin/env python3
# Written by `kvmatrix repro`: vLLM and torch only, every value below data. Exit status 0: vLLM does what EXPECTED
# says; an AssertionError: it does not, and the message says what it saw.
import fnmatch, functools, json, os, re, tempfile, traceback  # noqa: E401

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
CHECKS = [{'rule': 'layers', 'select': {'index_not': []},
           'wanted': {'kv_cache_dtype': ['fp8'], 'k_scale': [0.5], 'v_scale': [0.5]}}]
PATHS = {'runner': ['model_runner', 'worker.model_runner'],
         'forward_context': ['vllm_config.compilation_config.static_forward_context'],
         'kv_cache_config': ['kv_cache_config']}

os.environ.update(ENV)  # before vLLM is imported: it reads its environment once
import vllm  # noqa: E402
import torch, transformers  # noqa: E401, E402


def resolved(worker):  # inside the engine, read as kvmatrix's record reads it
    first = lambda obj, key: next((v for v in (functools.reduce(lambda o, a: getattr(o, a, None), p.split("."), obj)
                                               for p in PATHS.get(key, [])) if v is not None), None)  # noqa: E731
    runner = first(worker, "runner")
    groups, draft = first(runner, "kv_cache_config").kv_cache_groups, set(first(runner, "draft") or ())
    state = {"layers": []}
    for name, module in first(runner, "forward_context").items():  # the attention layers, numbered as the record does
        if hasattr(module, "kv_cache_dtype"):
            group = next((g for g in groups if name in g.layer_names), None)
            spec = getattr(group, "kv_cache_spec", None)
            spec = (getattr(spec, "kv_cache_specs", None) or {}).get(name, spec)  # a group of per-layer specs
            number = re.search(r"(?:^|\.)(\d+)(?:\.|$)", name)
            state["layers"].append({"layer_names": [name], "index": number and int(number[1]),
                                    "role": "draft" if name in draft else "target",
                                    "page_size_bytes": getattr(spec, "page_size_bytes", None),
                                    "k_scale": float(next(v for a in ('_k_scale_float', '_k_scale') if (v := getattr(module, a, None)) is not None)),
                                    "kv_cache_dtype": str(module.kv_cache_dtype),
                                    "v_scale": float(next(v for a in ('_v_scale_float', '_v_scale') if (v := getattr(module, a, None)) is not None))})
    return state


plain = {k: v for k, v in CONFIG.items() if k != "quantization_config"}  # transformers would quantize
plain["initializer_range"] = CONFIG["hidden_size"] ** -0.5
torch.manual_seed(0)
hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**plain), dtype=torch.bfloat16)
model = tempfile.mkdtemp()
scalars = {p.format(i): torch.tensor(v) for p, v, (first, end) in SCALARS for i in range(first, end)}
hf.save_pretrained(model, state_dict=hf.state_dict() | scalars)  # the checkpoint's own scalars (its KV scales)
with open(os.path.join(model, "config.json"), "w") as f:  # the checkpoint's own, its quantization included
    json.dump(CONFIG, f)
error = state = None
try:
    state = vllm.LLM(model=model, **ENGINE_ARGS).collective_rpc(resolved)[0]
except Exception as err:  # noqa: BLE001 - the exception is what this script observes, with where vLLM raised it
    site = [f"{f.filename.rsplit('vllm/', 1)[-1]}:{f.lineno} {f.name}" for f in traceback.extract_tb(err.__traceback__)
            if "/vllm/" in f.filename]
    error = f"{type(err).__name__}: {err} (raised at {site[-1] if site else '?'})"
print("observed:", error or state)
wrong = []  # the layers a rule selects, as kvmatrix's judge selects them (by index or role), or the groups /
chosen = lambda select: [la for la in state["layers"] if la["role"] == select.get("role", la["role"])  # noqa
                        and (la["index"] in select["index"] if "index" in select else la["index"]
                             not in select.get("index_not", []))]
for c in CHECKS if state else []:  # builders that hold them, each with the values the rule wants
    names = {la["layer_names"][0] for la in chosen(c["select"])}
    held = [x for x in state[c["rule"]] if names & set(x["layer_names"])]
    wrong += [f"no {c['rule']} of the layers {c['select']}"] if not held else [
        f"{c['rule']} of {x['layer_names']}: {f} {x.get(f)!r}" for x in held for f, w in c["wanted"].items()
        if not any(fnmatch.fnmatchcase(str(x.get(f)), str(v)) for v in w)]
assert (state and not wrong), f"expected {EXPECTED}; observed: {wrong or error}"
print("OK:", EXPECTED)
