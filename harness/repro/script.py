"""A minimal reproducer's text (`kvmatrix repro`): fixed code around data. Every value that comes from a case, a
record or a model (the cell id, texts, engine arguments, prompts) is written as a Python literal that is read back
and compared before the script is written, never pasted into code: a cell id that holds code stays a string.

The script writes the model into a temporary folder (config.json; where weights matter, random ones transformers
draws for the architecture with the checkpoint's scalars added), starts `vllm.LLM` with the cell's own engine
arguments, makes the one observation its spec names (harness/repro/minimal.py), and ends in one assert, so that its
exit status is the verdict: 0 where vLLM does what is expected, 1 with an AssertionError where the finding shows."""

from __future__ import annotations

import ast
from typing import Any

from kvmatrix.harness.repro import state_text
from kvmatrix.harness.repro.generate import ReproError
from kvmatrix.harness.repro.issue import NO_REFUSAL

WIDTH = 116
STATE_WIDTH = 120  # a state script's own tables (CHECKS, RATIOS, PATHS): the lint's line length

HEADER = """#!/usr/bin/env python3
# Written by `kvmatrix repro`: vLLM and torch only, every value below data. Exit status 0: vLLM does what EXPECTED
# says; an AssertionError: it does not, and the message says what it saw."""

CPU_EMULATION = """\
import torch.cpu  # noqa: E402 - vLLM asks torch which instruction sets the CPU has: GPU_CLASS's lacks these
vars(torch.cpu).update(dict.fromkeys(CPU_PROBES_OFF, lambda: False))"""

CUDA_EMULATION = """\
from vllm.platforms import cuda, interface  # noqa: E402 - vLLM decides as on GPU_CLASS; kernels run on the real card
for cls in [c for c in vars(cuda).values() if isinstance(c, type) and c.__module__ == cuda.__name__]:
    if "get_device_capability" in vars(cls):
        cls.get_device_capability = classmethod(lambda cls, device_id=0: interface.DeviceCapability(*CAPABILITY))"""

CONFIG_ONLY = """\
model = tempfile.mkdtemp()  # config.json alone: vLLM draws the weights (load_format dummy)
with open(os.path.join(model, "config.json"), "w") as f:
    json.dump(CONFIG, f)"""

WITH_DRAFT = """\
model, draft = tempfile.mkdtemp(), tempfile.mkdtemp()  # config.json alone: vLLM draws the weights (load_format dummy)
for folder, config in ((model, CONFIG), (draft, DRAFT_CONFIG)):
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)"""

# Random weights of the architecture, drawn by transformers with a spread (1/sqrt(hidden)) that leaves the logits no
# near ties everywhere; a quantization config is left out of what transformers builds and kept in config.json.
WEIGHT_IMPORTS = "import torch, transformers  # noqa: E401, E402"
PLAIN_CONFIG = """plain = dict(CONFIG, initializer_range=CONFIG["hidden_size"] ** -0.5)"""
QUANTIZED_CONFIG = """\
plain = {k: v for k, v in CONFIG.items() if k != "quantization_config"}  # transformers would quantize
plain["initializer_range"] = CONFIG["hidden_size"] ** -0.5"""
WEIGHTS = """\
torch.manual_seed(0)
hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**plain), dtype=torch.bfloat16)
model = tempfile.mkdtemp()"""
SAVE_PLAIN = "hf.save_pretrained(model)"
SAVE_WITH_SCALARS = """\
scalars = {p.format(i): torch.tensor(v) for p, v, (first, end) in SCALARS for i in range(first, end)}
hf.save_pretrained(model, state_dict=hf.state_dict() | scalars)  # the checkpoint's own scalars (its KV scales)"""
OWN_CONFIG = """\
with open(os.path.join(model, "config.json"), "w") as f:  # the checkpoint's own, its quantization included
    json.dump(CONFIG, f)"""

DRAFT_WEIGHTS = """\
draft = tempfile.mkdtemp()  # the draft's config.json and tensors of its shapes drawn at random (it loads them itself)
with open(os.path.join(draft, "config.json"), "w") as f:
    json.dump(DRAFT_CONFIG, f)
tensors = {name: torch.randn(shape, dtype=torch.bfloat16) * 0.02 for name, shape in DRAFT_TENSORS.items()}
safetensors.torch.save_file(tensors, os.path.join(draft, "model.safetensors"), metadata={"format": "pt"})"""

START = """try:
    llm = vllm.LLM(model=model, **ENGINE_ARGS)"""

GENERATE = """\
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], vllm.SamplingParams(**SAMPLING))
    print("greedy token ids:", [list(o.outputs[0].token_ids) for o in outputs])"""

CAUGHT = """\
except Exception as err:  # noqa: BLE001 - the exception is what this script observes, with where vLLM raised it
    site = [f"{f.filename.rsplit('vllm/', 1)[-1]}:{f.lineno} {f.name}" for f in traceback.extract_tb(err.__traceback__)
            if "/vllm/" in f.filename]
    error = f"{type(err).__name__}: {err} (raised at {site[-1] if site else '?'})"
print("observed:", error or "no exception")"""

REFUSED = """\
refused = error is not None and any(re.search(p, error, re.IGNORECASE) for p in REFUSALS)"""

ASSERT_CLEAN_RUN = """\
assert error is None, f"expected {EXPECTED}; observed: {error}"
print("OK:", EXPECTED)"""

ASSERT_RUNS = """\
observed = error or "@NO_REFUSAL@"
assert refused or (error is None and not REFUSAL_REQUIRED), f"expected {EXPECTED}; observed: {observed}"
print("OK:", EXPECTED)""".replace("@NO_REFUSAL@", NO_REFUSAL)

ASSERT_CRASH = """\
known = error is not None and any(re.search(p, error, re.IGNORECASE) for p in CRASH)
assert known, f"expected {EXPECTED}; observed: {error or 'it started and generated'}"
print("OK:", EXPECTED)"""

GREEDY = '''def greedy(args):
    """Each sequence's greedy tokens, each with the top logprobs where it was chosen (an engine at a time)."""
    gc.collect()  # the engine of the call before, if any, torn down first
    cleanup_dist_env_and_memory()
    outputs = vllm.LLM(model=model, **args).generate([{"prompt_token_ids": p} for p in PROMPTS],
                                                     vllm.SamplingParams(**SAMPLING))
    return [[(t, {k: v.logprob for k, v in p.items()}) for t, p in zip(c.token_ids, c.logprobs)]
            for c in (o.outputs[0] for o in outputs)]'''

COMPARE_TOKENS = """far = []
for s, (mine, theirs) in enumerate(zip(greedy(ENGINE_ARGS), greedy(ORACLE_ENGINE_ARGS))):
    at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a[0] != b[0]), None)
    if at is not None:  # a near tie: either run's choice within TIE_TOLERANCE of the other's (else of its last top-k)
        (a, a_lp), (b, b_lp) = mine[at], theirs[at]
        gap = min(a_lp[a] - a_lp.get(b, min(a_lp.values())), b_lp[b] - b_lp.get(a, min(b_lp.values())))
        print(f"sequence {s}: first divergent token {at}: eager {b}, this run {a}, tie gap {gap:.3f}")
        far += [s] if gap > TIE_TOLERANCE else []
assert not far, f"expected {EXPECTED}; sequences {far} diverge with no near tie (tie gap > {TIE_TOLERANCE})"
print("OK:", EXPECTED)"""


def literal(value: Any, indent: int = 0, width: int = WIDTH) -> str:
    """`value` as Python source that reads back as `value` (strings, numbers, None, booleans, lists, dicts), dict
    items packed into lines of WIDTH; anything else, or a text that would not read back, is refused."""
    text = _packed(value, indent, width)
    try:
        same = ast.literal_eval(text) == value
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        same = False
    if not same:
        raise ReproError(f"cannot write {value!r:.200} as data into a script")
    return text


def _packed(value: Any, indent: int, width: int = WIDTH) -> str:
    flat = repr(value)
    if not isinstance(value, (dict, list)) or indent + len(flat) <= width:
        return flat
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    items = ([f"{k!r}: {_packed(v, indent + len(repr(k)) + 3, width)}" for k, v in value.items()]
             if isinstance(value, dict) else [_packed(v, indent + 1, width) for v in value])
    lines, line = [], ""
    for item in items:
        if line and (indent + 1 + len(line) + len(item) + 2 > width or "\n" in item):
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
    kind = spec["observe"]
    if kind == "crash":
        return f"vLLM fails as the known failure {spec['crash']['signature']} (its message matched)"
    what = {"runs": "the engine starts and generates", "state": "; ".join(map(_check_text, spec.get("checks") or [])),
            "tokens": "the greedy tokens equal the eager oracle's, or part at a near tie"}[kind]
    return what + (f", or {refusal}" if refusal else "")


def _check_text(check: dict[str, Any]) -> str:
    chosen = f"layers {check['select']}" if isinstance(check["select"], list) else f"{check['select']} layers"
    if check["rule"] == "page_size_ratio":
        to = f"layers {check['to']}" if isinstance(check["to"], list) else f"{check['to']} layers"
        return f"the page of {chosen} is {check['equals']:g}x that of {to}"
    whose = {"layers": "", "groups": "' KV-cache groups", "builders": "' metadata builders"}[check["rule"]]
    wanted = ", ".join(f"{field} in {values}" for field, values in check["wanted"].items())
    return f"{chosen}{whose} resolve {wanted}"


def render(spec: dict[str, Any]) -> str:
    """The whole script for a minimal spec (harness/repro/minimal.py minimal_spec): the data, the imports (vLLM's
    after its environment is set), the model folder, the observation and its assert; functions set off by two
    blank lines."""
    kind = spec["observe"]
    head = [HEADER + "\n" + _imports(spec), "\n".join(_data(spec)), "\n".join(_preamble(spec))]
    functions = state_text.functions(spec["state_data"], spec.get("version")) if kind == "state" else (
        [GREEDY] if kind == "tokens" else [])
    main = [state_text.model_text(spec) or _model(spec)] if kind == "state" else [_model(spec)]
    if kind == "tokens":
        main.append(COMPARE_TOKENS)
    elif kind == "state":
        main.append(state_text.main_text(spec["state_data"], [REFUSED] if spec["refusals"] else []))
    elif kind == "crash":
        main += ["error = None", START, GENERATE, CAUGHT, ASSERT_CRASH]
    else:
        main += ["error = None", START, GENERATE, CAUGHT,
                 *([REFUSED, ASSERT_RUNS] if spec["refusals"] else [ASSERT_CLEAN_RUN])]
    return "\n\n".join(head) + "\n\n\n" + "".join(f + "\n\n\n" for f in functions) + "\n".join(main) + "\n"


def _imports(spec: dict[str, Any]) -> str:
    """One line: the script is read, not linted."""
    kind = spec["observe"]
    uses_re = kind in ("state", "crash") or (kind == "runs" and bool(spec["refusals"]))
    names = ["json", "os", "tempfile", *(["traceback"] if kind != "tokens" else []), *(["re"] if uses_re else []),
             *(["gc"] if kind == "tokens" else [])]
    if kind == "state":
        names = state_text.imports(spec)
    return f"import {', '.join(sorted(names))}" + ("  # noqa: E401" if len(names) > 1 else "")


def _data(spec: dict[str, Any]) -> list[str]:
    values: dict[str, Any] = {"CELL": spec["cell"], "GPU_CLASS": spec["gpu_class"], "EXPECTED": expected_text(spec),
                              "ENV": spec["env"], **_emulation_data(spec["emulate"])}
    values["CONFIG"] = spec["model"]["config"]
    if spec.get("draft"):  # the keys where the draft's config.json differs from the target's
        values["DRAFT_CONFIG"] = _draft_config(spec["model"]["config"], spec["draft"]["config"])
    if (spec.get("draft") or {}).get("tensors"):
        values["DRAFT_TENSORS"] = spec["draft"]["tensors"]
    if spec["model"].get("scalars"):
        values["SCALARS"] = spec["model"]["scalars"]
    values["ENGINE_ARGS"] = spec["engine_args"]
    kind = spec["observe"]
    if kind != "state":  # the state is read once the engine has started: no request is needed
        values |= {"PROMPTS": spec["prompts"], "SAMPLING": _sampling(spec)}
    if kind == "tokens":
        oracle = spec["oracle"]
        values |= {"ORACLE_ENGINE_ARGS": oracle["engine_args"], "TIE_TOLERANCE": oracle["tie_tolerance"]}
    elif kind == "crash":
        values["CRASH"] = spec["crash"]["patterns"]
    elif spec["refusals"]:
        values |= {"REFUSALS": spec["refusals"], "REFUSAL_REQUIRED": spec["refusal_required"]}
    if kind == "state":
        values |= spec["state_data"]
    own = set(spec.get("state_data") or ())
    return [f"{name} = {value.text}" if isinstance(value, _Source) else
            f"{name} = {literal(value, len(name) + 3, STATE_WIDTH if name in own else WIDTH)}"
            for name, value in values.items()]


def _emulation_data(emulate: dict[str, Any]) -> dict[str, Any]:
    """What the script patches to decide as its class: the CPU probes it turns off, the compute capability."""
    names = {"cpu_isa_probes_off": "CPU_PROBES_OFF", "compute_capability": "CAPABILITY"}
    return {name: emulate[key] for key, name in names.items() if emulate.get(key)}


class _Source:
    """A value written as an expression over data already written (every literal in it read back)."""

    def __init__(self, text: str) -> None:
        self.text = text


def _draft_config(target: dict[str, Any], draft: dict[str, Any]) -> Any:
    """`CONFIG | {...}` where the draft's config holds every key of the target's, else the draft's whole."""
    if set(target) - set(draft):
        return draft
    prefix = "CONFIG | "
    return _Source(prefix + literal({k: v for k, v in draft.items() if target.get(k) != v}, len("DRAFT_CONFIG = ")
                                    + len(prefix)))


def _sampling(spec: dict[str, Any]) -> dict[str, Any]:
    """Greedy decoding of the cell's length, token ids in and out (no tokenizer); top logprobs for a comparison."""
    out = {"temperature": 0.0, "max_tokens": spec["max_tokens"], "ignore_eos": True, "detokenize": False}
    return out | ({"logprobs": spec["oracle"]["top_logprobs"]} if spec["observe"] == "tokens" else {})


def _preamble(spec: dict[str, Any]) -> list[str]:
    lines = ["os.environ.update(ENV)  # before vLLM is imported: it reads its environment once"]
    if spec["emulate"].get("cpu_isa_probes_off"):
        lines.append(CPU_EMULATION)
    draws_draft = bool((spec.get("draft") or {}).get("tensors"))
    one_line = spec["weights"] and spec["observe"] == "state" and not draws_draft  # a state script's 60 lines
    lines.append("import torch, transformers, vllm  # noqa: E401, E402" if one_line else "import vllm  # noqa: E402")
    if spec["emulate"].get("compute_capability"):
        lines.append(CUDA_EMULATION)
    if spec["weights"] and not one_line:
        lines.append(WEIGHT_IMPORTS.replace("import ", "import safetensors.torch, " if draws_draft else "import "))
    if spec["observe"] == "tokens":
        lines.append("from vllm.distributed.parallel_state import cleanup_dist_env_and_memory  # noqa: E402")
    return lines


def _model(spec: dict[str, Any]) -> str:
    """The statements that write the model folder(s) and point the engine arguments at them."""
    if spec["weights"]:
        has_scalars, quantized = bool(spec["model"].get("scalars")), "quantization_config" in spec["model"]["config"]
        save = SAVE_WITH_SCALARS if has_scalars else SAVE_PLAIN
        lines = [QUANTIZED_CONFIG if quantized else PLAIN_CONFIG, WEIGHTS, save, *([OWN_CONFIG] if quantized else [])]
    else:
        lines = [WITH_DRAFT if spec.get("draft") else CONFIG_ONLY]
    draft = (spec["engine_args"].get("speculative_config") or {}).get("model")
    if draft is not None:  # the draft's folder: the target's own (an MTP layer) or its own config
        lines += [DRAFT_WEIGHTS] if spec["weights"] and draft != "@MODEL@" else []
        source = "model" if draft == "@MODEL@" else "draft"
        args = ["ENGINE_ARGS"] + (["ORACLE_ENGINE_ARGS"] if spec["observe"] == "tokens" else [])
        lines += [f'{name}["speculative_config"]["model"] = {source}' for name in args]
    return "\n".join(lines)
