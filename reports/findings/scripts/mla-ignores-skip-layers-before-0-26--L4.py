#!/usr/bin/env python3
# Written by `kvmatrix repro`: vLLM and torch only, every value below data. Exit status 0: vLLM does what EXPECTED
# says; an AssertionError: it does not, and the message says what it saw.
import fnmatch, functools, json, os, re, tempfile, traceback  # noqa: E401

CELL = 'deepseek-mla[kv=fp8,skip=0,spec=-,exec=eager]'
GPU_CLASS = 'L4'
EXPECTED = "not_skipped layers resolve kv_cache_dtype in ['fp8']; skipped layers resolve kv_cache_dtype in ['auto', 'bfloat16'], spec_dtype in ['bfloat16']; the page of skipped layers is 2x that of not_skipped layers"
ENV = {'VLLM_ENABLE_V1_MULTIPROCESSING': '0'}
CONFIG = {'architectures': ['DeepseekV2ForCausalLM'], 'bos_token_id': 0, 'eos_token_id': 1,
          'first_k_dense_replace': 4, 'hidden_size': 128, 'intermediate_size': 256, 'max_position_embeddings': 512,
          'model_type': 'deepseek_v2', 'moe_intermediate_size': 64, 'moe_layer_freq': 1, 'n_group': 1,
          'n_routed_experts': 4, 'n_shared_experts': 1, 'num_attention_heads': 4, 'num_experts_per_tok': 2,
          'num_hidden_layers': 4, 'num_key_value_heads': 4, 'pad_token_id': 2, 'q_lora_rank': None,
          'rope_theta': 10000.0, 'scoring_func': 'softmax', 'topk_group': 1, 'torch_dtype': 'bfloat16',
          'vocab_size': 320}
ENGINE_ARGS = {'dtype': 'bfloat16', 'max_model_len': 256, 'enforce_eager': True,
               'kv_cache_memory_bytes': 1073741824, 'gpu_memory_utilization': 0.05, 'kv_cache_dtype': 'fp8',
               'kv_cache_dtype_skip_layers': ['0'], 'load_format': 'dummy', 'skip_tokenizer_init': True}
CHECKS = [{'rule': 'layers', 'select': {'index_not': [0]}, 'wanted': {'kv_cache_dtype': ['fp8']}},
          {'rule': 'layers', 'select': {'index': [0]},
           'wanted': {'kv_cache_dtype': ['auto', 'bfloat16'], 'spec_dtype': ['bfloat16']}}]
RATIOS = [{'of': {'index': [0]}, 'to': {'index_not': [0]}, 'equals': 2.0}]
PATHS = {'runner': ['model_runner', 'worker.model_runner'],
         'forward_context': ['vllm_config.compilation_config.static_forward_context'],
         'kv_cache_config': ['kv_cache_config']}

os.environ.update(ENV)  # before vLLM is imported: it reads its environment once
import vllm  # noqa: E402


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
                                    "kv_cache_dtype": str(module.kv_cache_dtype),
                                    "spec_dtype": str(getattr(spec, "dtype", None)).removeprefix("torch.")})
    return state


model = tempfile.mkdtemp()  # config.json alone: vLLM draws the weights (load_format dummy)
with open(os.path.join(model, "config.json"), "w") as f:
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
for r in RATIOS if state else []:  # each side's one page size, as kvmatrix's judge divides them
    pages = [{la["page_size_bytes"] for la in chosen(r[side])} for side in ("of", "to")]
    if not all(len(p) == 1 and None not in p for p in pages) or abs(min(pages[0]) / min(pages[1]) - r["equals"]) > 1e-9:
        wrong.append(f"page sizes {pages[0]} / {pages[1]}, not {r['equals']}:1")
assert (state and not wrong), f"expected {EXPECTED}; observed: {wrong or error}"
print("OK:", EXPECTED)
