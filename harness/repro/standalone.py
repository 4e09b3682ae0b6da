"""The body of a standalone reproduction script (`kvmatrix repro`): copied verbatim into the script after its
SPEC and the checkpoint builder's `weights` function, so it imports only vLLM, torch, safetensors (a vLLM
dependency) and the standard library, never kvmatrix. Kept as a module so that ruff, mypy and the tests read it;
the names the script defines ahead of it are imported for the checkers alone, above the part copied."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the script defines ahead of this body, verbatim (harness/repro/generate.py render)
    from kvmatrix.harness.cell.workloads import _logprobs
    from kvmatrix.harness.judge.tokens import compare_sequence
    from kvmatrix.harness.models.checkpoint import per_channel_fp8, weights

import enum
import json
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def write_model(folder: Path, model: dict) -> None:
    """The checkpoint folder: its small files verbatim, then the weights regenerated from (seed, tensor name)
    exactly as kvmatrix's builder draws them, plus the few tensors it sets by hand (e.g. k_scale / v_scale)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in model["files"].items():
        (folder / name).write_text(text)
    if model.get("shapes") is None:  # config-only checkpoint (loaded with load_format dummy)
        return
    import torch
    from safetensors.torch import save_file

    tensors = weights({k: tuple(v) for k, v in model["shapes"].items()}, model["seed"])
    tensors = per_channel_fp8(tensors, model.get("fp8_per_channel", []))
    for name, (dtype, shape, values) in model["extra"].items():
        tensors[name] = torch.tensor(values, dtype=getattr(torch, dtype)).reshape(shape)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def emulate(emulation: dict) -> None:
    """Inlined from kvmatrix's harness/vllm_compat/emulation.py: make vLLM take another class's decisions."""
    if emulation.get("compute_capability"):
        # emulate_device_capability: every class defined in vllm.platforms.cuda that has get_device_capability
        # reports this capability (kernels still run on the real card).
        import vllm.platforms.cuda as cuda
        from vllm.platforms.interface import DeviceCapability

        capability = DeviceCapability(*emulation["compute_capability"])
        for obj in list(vars(cuda).values()):
            if isinstance(obj, type) and obj.__module__ == cuda.__name__ and "get_device_capability" in vars(obj):
                # Patching vLLM's class on purpose; mypy knows `obj` only as some class, without this method.
                obj.get_device_capability = classmethod(  # type: ignore[attr-defined]
                    lambda cls, device_id=0: capability)
    for probe in emulation.get("cpu_isa_probes_off", []):
        # emulate_cpu_isa: the CPU backend asks torch.cpu which instruction sets exist; higher levels answer no.
        import torch.cpu

        if hasattr(torch.cpu, probe):
            setattr(torch.cpu, probe, lambda: False)


def _plain(value):
    if isinstance(value, enum.Enum):
        return value.name
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value).removeprefix("torch.")


def layer_index(name: str):
    match = re.search(r"(?:^|\.)(\d+)(?:\.|$)", name)
    return int(match.group(1)) if match else None


def resolved_layers(worker, draft_layer_offset=None) -> list:
    """Run inside the worker (llm.collective_rpc): each attention layer's kv_cache_dtype and its KV spec."""
    runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
    context = runner.vllm_config.compilation_config.static_forward_context
    specs = {}
    for group in runner.kv_cache_config.kv_cache_groups:
        per_layer = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        for name in group.layer_names:
            specs[name] = per_layer.get(name) if isinstance(per_layer, dict) else group.kv_cache_spec
    drafter = getattr(runner, "drafter", None)
    draft = set(getattr(drafter, "_draft_attn_layer_names", None) or getattr(drafter, "attn_layer_names", None)
                or ())
    layers = []
    for name, module in context.items():
        if not hasattr(module, "kv_cache_dtype"):
            continue
        index, spec = layer_index(name), specs.get(name)
        by_offset = not draft and draft_layer_offset is not None and (index or 0) >= draft_layer_offset
        layers.append({"name": name, "index": index, "role": "draft" if name in draft or by_offset else "target",
                       "kv_cache_dtype": _plain(module.kv_cache_dtype),
                       "spec_dtype": _plain(getattr(spec, "dtype", None)),
                       "page_size_bytes": _plain(getattr(spec, "page_size_bytes", None))})
    return layers


def select(layers: list, selector, skip_layers: list) -> list:
    if isinstance(selector, list):
        return [la for la in layers if la["index"] in selector]
    skipped = {str(s) for s in skip_layers}
    return [la for la in layers if {
        "all": True, "target": la["role"] == "target", "draft": la["role"] == "draft",
        "skipped": str(la["index"]) in skipped, "not_skipped": str(la["index"]) not in skipped}[selector]]


def wanted(condition, actual) -> bool:
    return actual in condition if isinstance(condition, list) else actual == condition


def problems_of(spec: dict, layers, error) -> list:
    """What contradicts the case's expectations for this cell (empty: it holds)."""
    expect = spec["expect"]
    refuse = expect.get("refuse")
    if error is not None:
        if refuse and any(re.search(p, error, re.I) for p in refuse["patterns"]):
            return []
        return [f"vLLM failed: {error}" + (f" (expected a refusal {refuse['signatures']})" if refuse else "")]
    if refuse and not refuse["optional"]:
        return [f"vLLM started, expected it to refuse with {refuse['signatures']}"]
    out = []
    for check in expect["layers"]:
        chosen = select(layers, check["select"], spec["skip_layers"])
        if not chosen:
            out.append(f"no {check['select']} layers")
        out += [f"{la['name']}: {field} is {la.get(field)!r}, expected {cond!r}"
                for la in chosen for field, cond in check["wanted"].items() if not wanted(cond, la.get(field))]
    for ratio in expect["page_size_ratios"]:
        of, to = (select(layers, ratio[k], spec["skip_layers"]) for k in ("of", "to"))
        if not of or not to or not of[0]["page_size_bytes"] or not to[0]["page_size_bytes"]:
            out.append(f"page size ratio {ratio['of']}/{ratio['to']}: no page sizes")
            continue
        got = of[0]["page_size_bytes"] / to[0]["page_size_bytes"]
        if abs(got - ratio["equals"]) > 1e-9:
            out.append(f"page size ratio {ratio['of']}/{ratio['to']} is {got}, expected {ratio['equals']}")
    return out


def run(spec: dict, engine_args: dict | None = None):
    """(resolved layers, generated texts, error, greedy token ids, per-position logprobs or None): the engine
    started, probed and generating, or why it failed."""
    import vllm

    args = json.loads(json.dumps(engine_args or spec["engine_args"]).replace("@HERE@", str(HERE)))
    top = (spec.get("oracle") or {}).get("top_logprobs")
    try:
        llm = vllm.LLM(**args)
        layers = llm.collective_rpc(resolved_layers, args=(spec["draft_layer_offset"],))[0]
        params = vllm.SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True,
                                     **({"logprobs": top} if top else {}))
        outputs = llm.generate(spec["prompts"], params)
    except Exception as err:  # noqa: BLE001 - a refusal or a crash is what this script observes
        return None, None, f"{type(err).__name__}: {err}", None, None
    logprobs = [_logprobs(o.outputs[0]) for o in outputs] if top else None
    return (layers, [o.outputs[0].text for o in outputs], None, [list(o.outputs[0].token_ids) for o in outputs],
            logprobs)


def run_oracle(spec: dict, error, tokens, logprobs) -> list:
    """A differential cell's oracle: the same configuration run eager and plain, after the cell's engine is gone;
    the problems its comparison finds, by kvmatrix's own rule (a crash in one run only; tokens that differ where
    they must not: exactly, or beyond the logprob tolerance, or at a divergence that is no near tie)."""
    import gc

    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    oracle = spec["oracle"]
    gc.collect()
    cleanup_dist_env_and_memory()
    _, _, oracle_error, oracle_tokens, oracle_logprobs = run(spec, oracle["engine_args"])
    print(f"oracle {oracle['cell_id']} ({oracle['mode']}): error {oracle_error}; tokens {oracle_tokens}")
    print(f"this cell: error {error}; tokens {tokens}")
    if (error is None) != (oracle_error is None):
        crashed = "this cell" if error is not None else f"the oracle ({oracle['mode']})"
        return [f"crashes in {crashed} only"]
    problems = []
    for s, (mine, theirs) in enumerate(zip(tokens or [], oracle_tokens or [], strict=False)):
        got = compare_sequence(mine, theirs, logprobs[s] if logprobs else None,
                               oracle_logprobs[s] if oracle_logprobs else None, oracle["tokens_exact"],
                               oracle["logprob_tolerance"], oracle["tie_tolerance"])
        print(f"sequence {s} against the oracle: {got}")
        if not got["ok"]:
            problems.append(f"sequence {s} disagrees with the oracle's ({got})")
    return problems


def main(spec: dict) -> None:
    os.environ.update(spec["env"])  # before vLLM is imported: it reads its environment once
    for name, model in spec["models"].items():
        write_model(HERE / name, model)
    emulate(spec["emulate"])
    layers, texts, error, tokens, logprobs = run(spec)
    for note in spec["expect"]["not_encoded"]:
        print(f"NOT ENCODED (check by hand): {note}", file=sys.stderr)
    print("observed error:", error)
    for la in layers or []:
        print(f"observed layer {la['name']}: kv_cache_dtype={la['kv_cache_dtype']} spec_dtype={la['spec_dtype']} "
              f"page_size_bytes={la['page_size_bytes']} role={la['role']}")
    print("generated:", texts)
    problems = problems_of(spec, layers, error)
    if spec.get("oracle"):
        problems += run_oracle(spec, error, tokens, logprobs)
    assert not problems, f"{spec['cell_id']} on {spec['gpu_class']}: " + "; ".join(problems)
    print(f"OK: {spec['cell_id']} on {spec['gpu_class']} holds what the case expects")
