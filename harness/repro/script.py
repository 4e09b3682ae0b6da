"""A minimal reproducer's text (`kvmatrix repro`): fixed code around data. Every value that comes from a case, a
record or a model (the cell id, texts, engine arguments, prompts) is written as a Python literal that is read back
and compared before the script is written, never pasted into code: a cell id that holds code stays a string.

The script writes the model next to nothing (a temporary folder: config.json, and a seeded random checkpoint where
weights matter), starts `vllm.LLM` with the cell's own engine arguments, makes the one observation its spec names
(harness/repro/minimal.py), and ends in one assert, so that its exit status is the verdict: 0 where vLLM does what
is expected, 1 with an AssertionError where the finding reproduces."""

from __future__ import annotations

import ast
import re
from typing import Any

from kvmatrix.harness.repro.generate import ReproError

WIDTH = 116

HEADER = """#!/usr/bin/env python3
# A standalone reproducer written by `kvmatrix repro` (vLLM and torch only); every value below is data.
# Exit status 0: vLLM does what EXPECTED says; an AssertionError: it does not, and the message says what it saw."""

CPU_EMULATION = """import torch.cpu  # noqa: E402
for probe in CPU_PROBES_OFF:  # GPU_CLASS's CPU lacks these instruction sets: vLLM asks torch whether they exist
    setattr(torch.cpu, probe, lambda: False)"""

CUDA_EMULATION = """import vllm.platforms.cuda as cuda  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402
for cls in [c for c in vars(cuda).values() if isinstance(c, type) and c.__module__ == cuda.__name__]:
    if "get_device_capability" in vars(cls):  # vLLM decides as on GPU_CLASS; kernels run on the real card
        cls.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(*CAPABILITY))"""

WRITE_MODEL = '''def write_model(config, weights=None):
    """A model folder: config.json, and where weights matter a seeded random checkpoint of the right shapes."""
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    if weights:
        write_weights(folder, **weights)
    return folder'''

WRITE_WEIGHTS = '''def write_weights(folder, shapes, fp8, scalars):
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    names = {p.format(*i): s for p, s, ranges in shapes for i in itertools.product(*(range(*r) for r in ranges))}
    t = {n: (torch.ones(s) if n.endswith("norm.weight") else torch.randn(s) * s[-1] ** -0.5).to(torch.bfloat16)
         for n, s in sorted(names.items())}
    for n in fp8:  # FP8 per output channel, with its scale, as compressed-tensors stores it
        scale = (t[n].float().abs().amax(1, keepdim=True) / 448).clamp(min=1e-12)
        t[n], t[n.removesuffix("weight") + "weight_scale"] = (t[n].float() / scale).to(torch.float8_e4m3fn), scale
    save_file(t | {n: torch.tensor(v) for n, v in scalars.items()}, os.path.join(folder, "model.safetensors"))'''

WRITE_CONFIG = """model = tempfile.mkdtemp()  # config.json alone: vLLM draws the weights (load_format dummy)
with open(os.path.join(model, "config.json"), "w") as f:
    json.dump(CONFIG, f)"""

RESOLVED_LAYERS = '''def resolved_layers(worker):
    """Inside the engine: each attention layer's KV-cache dtype and its KV spec's dtype and page size."""
    runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
    specs = {}
    for group in runner.kv_cache_config.kv_cache_groups:
        per_layer = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        specs |= {n: per_layer[n] if isinstance(per_layer, dict) else group.kv_cache_spec for n in group.layer_names}
    return {int(re.search(r"\\.(\\d+)\\.", name).group(1)): {
        "kv_cache_dtype": str(module.kv_cache_dtype), "page_size_bytes": getattr(specs.get(name), "page_size_bytes", None),
        "spec_dtype": str(getattr(specs.get(name), "dtype", None)).removeprefix("torch.")}
        for name, module in runner.vllm_config.compilation_config.static_forward_context.items()
        if hasattr(module, "kv_cache_dtype")}'''

START = """error = None
try:
    llm = vllm.LLM(model=model, **ENGINE_ARGS)"""

READ_LAYERS = """    layers = llm.collective_rpc(resolved_layers)[0]
    for index, layer in sorted(layers.items()):
        print(f"layer {index}: {layer}")"""

GENERATE = """    params = vllm.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in PROMPTS], params)
    print("greedy token ids:", [list(o.outputs[0].token_ids) for o in outputs])
except Exception as err:  # noqa: BLE001 - the exception is what this script observes
    error = f"{type(err).__name__}: {err}"
print("observed:", error or "no exception")"""

REFUSED = """refused = error is not None and any(re.search(p, error, re.IGNORECASE) for p in REFUSALS)"""

ASSERT_CLEAN_RUN = """assert error is None, f"expected {EXPECTED}; observed: {error}"
print("OK:", EXPECTED)"""

ASSERT_RUNS = """assert refused or (error is None and not REFUSAL_REQUIRED), f"expected {EXPECTED}; observed: {error or 'it ran'}"
print("OK:", EXPECTED)"""

ASSERT_LAYERS = """wrong = [f"layer {i}: {c['field']} {layers[i][c['field']]!r}, expected one of {c['wanted']}"
         for c in CHECKS for i in c["layers"] if layers and (i not in layers or layers[i][c['field']] not in c["wanted"])]
assert refused or (layers and not wrong and not REFUSAL_REQUIRED), f"expected {EXPECTED}; observed: {wrong or error}"
print("OK:", EXPECTED)"""


TOKENS = '''def greedy(args):
    """Greedy token ids and each position's top logprobs; the engine torn down after."""
    llm = vllm.LLM(model=model, **args)
    params = vllm.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=TOP_LOGPROBS, ignore_eos=True,
                                 detokenize=False)
    outputs = [o.outputs[0] for o in llm.generate([{"prompt_token_ids": ids} for ids in PROMPTS], params)]
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    return [(list(o.token_ids), [{t: lp.logprob for t, lp in p.items()} for p in o.logprobs]) for o in outputs]


def lead(position, chosen, other):
    """How far `chosen` is ahead of `other` there (`other` below the top logprobs: at least to the last of them)."""
    return position[chosen] - position.get(other, min(position.values()))


far = []
for s, ((mine, mine_lp), (theirs, theirs_lp)) in enumerate(zip(greedy(ENGINE_ARGS), greedy(ORACLE_ENGINE_ARGS))):
    at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
    gap = None if at is None else min(lead(mine_lp[at], mine[at], theirs[at]), lead(theirs_lp[at], theirs[at], mine[at]))
    print(f"sequence {s}: first divergence {at}" + ("" if at is None else f": eager {theirs[at]}, this {mine[at]}, "
                                                   f"tie gap {gap:.3f}"))
    far += [s] if gap is not None and gap > TIE_TOLERANCE else []
assert not far, f"expected {EXPECTED}; sequences {far} diverge from eager with no near tie (gap > {TIE_TOLERANCE})"
print("OK:", EXPECTED)'''


def literal(value: Any, indent: int = 0) -> str:
    """`value` as Python source that reads back as `value` (strings, numbers, None, booleans, lists, dicts), dict
    items packed into lines of WIDTH; anything else, or a text that would not read back, is refused."""
    text = _packed(value, indent)
    try:
        same = ast.literal_eval(text) == value
    except (ValueError, SyntaxError):
        same = False
    if not same:
        raise ReproError(f"cannot write {value!r} as data into a script")
    return text


def _packed(value: Any, indent: int) -> str:
    flat = repr(value)
    if not isinstance(value, (dict, list)) or indent + len(flat) <= WIDTH:
        return flat
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    items = ([f"{k!r}: {_packed(v, indent + len(repr(k)) + 3)}" for k, v in value.items()] if isinstance(value, dict)
             else [_packed(v, indent + 1) for v in value])
    lines, line = [], ""
    for item in items:
        if line and indent + 1 + len(line) + len(item) + 2 > WIDTH or "\n" in item:
            lines.append(line)
            line = ""
        line += ("" if not line else " ") + item + ","
    lines.append(line.rstrip(","))
    return opening + ("\n" + " " * (indent + 1)).join(lines) + closing


def expected_text(spec: dict[str, Any]) -> str:
    """What the assert holds vLLM to, in words."""
    refusal = "refuses at start in words the case accepts" if spec["refusals"] else ""
    if spec["refusal_required"]:
        return f"vLLM {refusal}"
    what = {"runs": "the engine starts and generates",
            "layers": "every checked layer resolves what CHECKS wants",
            "tokens": "the greedy tokens equal the eager oracle's, or part at a near tie"}[spec["observe"]]
    return what + (f", or {refusal}" if refusal else "")


def render(spec: dict[str, Any]) -> str:
    """The whole script for a minimal spec (harness/repro/minimal.py minimal_spec)."""
    kind = spec["observe"]
    lines = [HEADER, _imports(spec), "", *_data(spec), "", *_preamble(spec), ""]
    if spec["model"].get("shapes"):
        lines += ["", WRITE_WEIGHTS, ""]
    if _one_config_only(spec):
        lines += [WRITE_CONFIG]
    else:
        lines += ["", WRITE_MODEL, ""]
    if kind == "layers":
        lines += ["", RESOLVED_LAYERS, ""]
    if not _one_config_only(spec):
        lines += ["", _models(spec)]
    if kind == "tokens":
        lines += ["", "", TOKENS]
    elif kind == "layers":
        lines += ["layers = None", START, READ_LAYERS, GENERATE, REFUSED, ASSERT_LAYERS]
    else:
        lines += [START, GENERATE, *([REFUSED, ASSERT_RUNS] if spec["refusals"] else [ASSERT_CLEAN_RUN])]
    text = "\n".join(lines) + "\n"
    return re.sub(r"\n{4,}", "\n\n\n", text)


def _one_config_only(spec: dict[str, Any]) -> bool:
    """No weights to write and no draft of its own: the model folder is three lines of the script."""
    return not spec["model"].get("shapes") and not spec.get("draft")


def _imports(spec: dict[str, Any]) -> str:
    uses_re = spec["observe"] == "layers" or bool(spec["refusals"]) and spec["observe"] == "runs"
    names = ["json", "os", "tempfile"] + (["re"] if uses_re else []) + (["gc"] if spec["observe"] == "tokens" else [])
    names += ["itertools"] if spec["model"].get("shapes") else []
    return "\n".join(f"import {name}" for name in sorted(names))


def _data(spec: dict[str, Any]) -> list[str]:
    values: dict[str, Any] = {"CELL": spec["cell"], "GPU_CLASS": spec["gpu_class"], "EXPECTED": expected_text(spec),
                              "ENV": spec["env"]}
    emulate = spec["emulate"]
    if emulate.get("cpu_isa_probes_off"):
        values["CPU_PROBES_OFF"] = emulate["cpu_isa_probes_off"]
    if emulate.get("compute_capability"):
        values["CAPABILITY"] = emulate["compute_capability"]
    values["CONFIG"] = spec["model"]["config"]
    if spec.get("draft"):
        values["DRAFT_CONFIG"] = spec["draft"]["config"]
    for name, part in (("WEIGHTS", spec["model"]), ("DRAFT_WEIGHTS", spec.get("draft") or {})):
        if part.get("shapes"):
            values[name] = {k: part[k] for k in ("shapes", "fp8", "scalars")}
    values |= {"ENGINE_ARGS": spec["engine_args"], "PROMPTS": spec["prompts"], "MAX_TOKENS": spec["max_tokens"]}
    if spec["observe"] == "tokens":
        oracle = spec["oracle"]
        values |= {"ORACLE_ENGINE_ARGS": oracle["engine_args"], "TOP_LOGPROBS": oracle["top_logprobs"],
                   "TIE_TOLERANCE": oracle["tie_tolerance"]}
    elif spec["refusals"] or spec["observe"] == "layers":
        values |= {"REFUSALS": spec["refusals"], "REFUSAL_REQUIRED": spec["refusal_required"]}
    if spec["observe"] == "layers":
        values["CHECKS"] = spec["checks"]
    return [f"{name} = {literal(value, len(name) + 3)}" for name, value in values.items()]


def _preamble(spec: dict[str, Any]) -> list[str]:
    lines = ["os.environ.update(ENV)  # before vLLM is imported: it reads its environment once"]
    if spec["emulate"].get("cpu_isa_probes_off"):
        lines.append(CPU_EMULATION)
    lines.append("import vllm  # noqa: E402")
    if spec["emulate"].get("compute_capability"):
        lines.append(CUDA_EMULATION)
    if spec["observe"] == "tokens":
        lines.append("from vllm.distributed.parallel_state import cleanup_dist_env_and_memory  # noqa: E402")
    return lines


def _models(spec: dict[str, Any]) -> str:
    weights = ", WEIGHTS" if spec["model"].get("shapes") else ""
    lines = [f"model = write_model(CONFIG{weights})"]
    speculative = spec["engine_args"].get("speculative_config") or {}
    if speculative:
        source = ("model" if speculative.get("model") == "@MODEL@" else
                  "write_model(DRAFT_CONFIG" + (", DRAFT_WEIGHTS" if (spec.get("draft") or {}).get("shapes") else "")
                  + ")")
        args = ["ENGINE_ARGS"] + (["ORACLE_ENGINE_ARGS"] if spec["observe"] == "tokens" else [])
        lines += [f'{name}["speculative_config"]["model"] = {source}' for name in args]
    return "\n".join(lines)
