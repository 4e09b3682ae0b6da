#!/usr/bin/env python3
# Written by `kvmatrix repro`: vLLM and torch only, every value below data. Exit status 0: vLLM does what EXPECTED
# says; an AssertionError: it does not, and the message says what it saw.
import fnmatch, functools, json, os, pathlib, re, tempfile, types  # noqa: E401

CELL = 'deepseek-mla[kv=fp8,skip=0,spec=-]'
GPU_CLASS = 'cpu-avx512'
EXPECTED = "not_skipped layers resolve kv_cache_dtype in ['fp8']; skipped layers resolve kv_cache_dtype in ['auto', 'bfloat16'], spec_dtype in ['bfloat16']; the page of skipped layers is 2x that of not_skipped layers"
ENV = {'VLLM_ENABLE_V1_MULTIPROCESSING': '0'}
CONFIG = {'architectures': ['DeepseekV2ForCausalLM'], 'bos_token_id': 0, 'eos_token_id': 1,
          'first_k_dense_replace': 4, 'hidden_size': 128, 'intermediate_size': 256, 'max_position_embeddings': 512,
          'model_type': 'deepseek_v2', 'moe_intermediate_size': 64, 'moe_layer_freq': 1, 'n_group': 1,
          'n_routed_experts': 4, 'n_shared_experts': 1, 'num_attention_heads': 4, 'num_experts_per_tok': 2,
          'num_hidden_layers': 4, 'num_key_value_heads': 4, 'pad_token_id': 2, 'q_lora_rank': None,
          'rope_theta': 10000.0, 'scoring_func': 'softmax', 'topk_group': 1, 'torch_dtype': 'bfloat16',
          'vocab_size': 320}
ENGINE_ARGS = {'dtype': 'bfloat16', 'max_model_len': 256, 'enforce_eager': True, 'kv_cache_memory_bytes': 33554432,
               'kv_cache_dtype': 'fp8', 'kv_cache_dtype_skip_layers': ['0'], 'load_format': 'dummy',
               'skip_tokenizer_init': True}
CHECKS = [['kv_cache_dtype', ['layer.kv_cache_dtype'], ['index', 'not in', [0]], ['fp8']],
          ['kv_cache_dtype', ['layer.kv_cache_dtype'], ['index', 'in', [0]], ['auto', 'bfloat16']],
          ['spec_dtype', ['spec.dtype'], ['index', 'in', [0]], ['bfloat16']]]
RATIOS = [['page_size_bytes', ['spec.page_size_bytes'], ['index', 'in', [0]], ['index', 'not in', [0]], 2.0]]
PATHS = {'runner': ['model_runner', 'worker.model_runner'], 'kv_cache_config': ['kv_cache_config'],
         'layers': ['vllm_config.compilation_config.static_forward_context']}

os.environ.update(ENV)  # before vLLM is imported: it reads its environment once
import vllm  # noqa: E402


def resolved(worker):  # inside the engine: each attention layer (numbered by the first number in its name) with
    first = lambda obj, paths: next((v for v in (functools.reduce(lambda o, a: getattr(o, a, None), p.split("."), obj)
                                                 for p in paths) if v is not None), None)  # noqa: E731
    plain = lambda v: getattr(v, "_name_", None) or str(v).removeprefix("torch.")  # noqa: E731 - as the record
    runner, layers = first(worker, PATHS["runner"]), []  # the values CHECKS name, as kvmatrix's record reads them
    held = {n: g.kv_cache_spec for g in first(runner, PATHS["kv_cache_config"]).kv_cache_groups for n in g.layer_names}
    for name, layer in [(n, m) for n, m in first(runner, PATHS["layers"]).items() if hasattr(m, "kv_cache_dtype")]:
        number, at = re.search(r"(?:^|\.)(\d+)(?:\.|$)", name), types.SimpleNamespace(layer=layer, group=held.get(name))
        at.spec = (getattr(at.group, "kv_cache_specs", None) or {}).get(name, at.group)  # its own in its group
        row = {"name": name, "index": number and int(number[1]), "role": "target"}
        layers.append(row | {field: plain(first(at, paths)) for field, paths, *_ in CHECKS + RATIOS if paths})
    return layers


pathlib.Path(model := tempfile.mkdtemp(), "config.json").write_text(json.dumps(CONFIG))  # vLLM draws the weights
state = vllm.LLM(model=model, **ENGINE_ARGS).collective_rpc(resolved)[0]
chosen = lambda key, op, values: [la for la in state if (la[key] in values) == (op == "in")]  # noqa: E731 - as judged
wrong = [f"no layer with {' '.join(map(str, select))}" for _, _, select, _ in CHECKS if not chosen(*select)]
wrong += [f"layer {la['name']}: {field} {la[field]!r}" for field, _, select, wanted in CHECKS  # each wanted a glob
          for la in chosen(*select) if not any(fnmatch.fnmatchcase(la[field], str(w)) for w in wanted)]
pages = [[{la[field] for la in chosen(*side)} for side in (of, to)] for field, _, of, to, _ in RATIOS]
wrong += [f"page sizes {p} / {q}, not {row[-1]}:1" for (p, q), row in zip(pages, RATIOS)  # each side's one page size
          if not all(len(s) == 1 and "None" not in s for s in (p, q)) or abs(int(*p) / int(*q) - row[-1]) > 1e-9]
assert not wrong, f"expected {EXPECTED}; observed: {wrong}"
print("OK:", EXPECTED)
