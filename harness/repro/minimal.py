"""What a minimal reproducer needs to know of a cell, as data: the model's config (and, where weights matter, the
shapes of its tensors), the engine arguments that are the cell's own, the prompts as token ids, and the one
observation the script asserts on:

- `runs`: the engine starts and generates, or refuses at start in words the case accepts (the exception is the
  observation; a public one);
- `layers`: the KV-cache dtype, spec dtype or page size each selected layer resolved (read inside the engine);
- `tokens`: the greedy tokens against the same configuration run eager, the divergence a near tie or none.

Weights are vLLM's dummy ones (`load_format="dummy"`: config.json alone) unless the observation depends on them
(`tokens`, or a loader bug): then a seeded random checkpoint of the tiny builder's tensor shapes is written. The
script (harness/repro/script.py) holds every value here as a Python literal checked to read back as itself."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

from kvmatrix.harness import vllm_compat
from kvmatrix.harness.record.model import JudgedRecord
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.repro.generate import ReproError, emulation
from kvmatrix.harness.run.engine_args import engine_args_for, models_needed
from kvmatrix.harness.run.model_builds import build_models
from kvmatrix.matrix.conditions import when_matches
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.expectations import RecordCheck
from kvmatrix.matrix.schema import ModelEntry

OBSERVATIONS = ("runs", "layers", "tokens")
PROBED = ("kv_cache_dtype", "spec_dtype", "page_size_bytes")  # what the script reads of each layer
# Engine arguments the script sets itself (the model folder) or that change nothing a finding is about.
NOT_THE_CELLS_OWN = ("model", "tokenizer", "seed")
MODEL, DRAFT = "@MODEL@", "@DRAFT@"  # where the script's own model folders go


def shape_patterns(shapes: dict[str, list[int]]) -> list[list]:
    """Tensor shapes in few entries: [name pattern with {} for each number, shape, [start, stop] per number],
    one entry wherever the numbered names form a whole product of ranges (every layer, every expert)."""
    groups: dict[tuple[str, tuple[int, ...]], list[tuple[int, ...]]] = {}
    for name, shape in sorted(shapes.items()):
        numbers = tuple(int(n) for n in re.findall(r"(?<=\.)\d+(?=\.)", name))
        pattern = re.sub(r"(?<=\.)\d+(?=\.)", "{}", name)
        groups.setdefault((pattern, tuple(shape)), []).append(numbers)
    out = []
    for (pattern, shape), indices in groups.items():
        ranges = [[min(axis), max(axis) + 1] for axis in zip(*indices, strict=True)]
        if sorted(indices) == list(itertools.product(*(range(*r) for r in ranges))):
            out.append([pattern, list(shape), ranges])
        else:  # a ragged set (some layers only): one entry per tensor
            out += [[pattern, list(shape), [[n, n + 1] for n in numbers]] for numbers in indices]
    return out


def checkpoint_data(folder: Path, weights: bool) -> dict[str, Any]:
    """config.json, and with `weights` the shapes of its bf16 tensors, the FP8 ones (quantized per output channel
    as compressed-tensors writes them) and the scalars (a kv_cache_scheme's scales) by value."""
    out: dict[str, Any] = {"config": json.loads((folder / "config.json").read_text())}
    path = folder / "model.safetensors"
    if not weights:
        return out
    if not path.exists():
        raise ReproError(f"{folder.name} is config only: its weights are dummy, nothing to write")
    from safetensors import safe_open

    shapes, fp8, scalars = {}, [], {}
    with safe_open(str(path), "pt") as stored:
        for name in stored.keys():
            tensor = stored.get_slice(name)
            shape, dtype = list(tensor.get_shape()), tensor.get_dtype()
            if not shape:
                scalars[name] = float(stored.get_tensor(name).item())
            elif name.endswith("weight_scale"):
                continue  # written again from its FP8 weight
            else:
                shapes[name] = shape
                if dtype == "F8_E4M3":
                    fp8.append(name)
    return {**out, "shapes": shape_patterns(shapes), "fp8": sorted(fp8), "scalars": scalars}


def prompt_ids(folder: Path, prompts: list[str]) -> list[list[int]]:
    """The prompts as the model's own tokenizer encodes them (what vLLM fed the cell): the script skips the
    tokenizer and passes token ids."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [tokenizer.encode(prompt).ids for prompt in prompts]


def own_engine_args(args: dict[str, Any], draft_is_target: bool, weights: bool) -> dict[str, Any]:
    """The engine arguments without what the script sets itself; the draft's folder a placeholder."""
    out = {k: v for k, v in args.items() if k not in NOT_THE_CELLS_OWN}
    if "speculative_config" in out:
        out["speculative_config"] = {**out["speculative_config"], "model": MODEL if draft_is_target else DRAFT}
    if not weights:
        out.setdefault("load_format", "dummy")
    out["skip_tokenizer_init"] = True
    return out


def layer_checks(cell: Cell, context: dict, target: int, layers: int) -> list[dict[str, Any]]:
    """The case's applicable layer rules on the fields the script reads, each as the layer indices it selects (of
    `layers`: the `target`'s first, then a draft's) and the values wanted; ranges and globs are left to the harness."""
    skipped = {int(s) for s in cell.axes["kv_cache_dtype_skip_layers"] or [] if str(s).isdigit()}
    selectors = {"all": range(layers), "target": range(target), "draft": range(target, layers),
                 "skipped": sorted(skipped), "not_skipped": [i for i in range(layers) if i not in skipped]}
    checks = []
    for rule in cell.case.expect:
        if rule.layers is None or not when_matches(rule.when, context):
            continue
        for field, wanted in _probed(rule.layers).items():
            chosen = rule.layers.select if isinstance(rule.layers.select, list) else selectors[rule.layers.select]
            checks.append({"layers": list(chosen), "field": field,
                           "wanted": wanted if isinstance(wanted, list) else [wanted]})
    return checks


def _probed(check: RecordCheck) -> dict[str, Any]:
    plain = (str, int, float, list)
    return {k: v for k, v in check.wanted().items() if k in PROBED and isinstance(v, plain)
            and not (isinstance(v, str) and (set("*?<>") & set(v)))}


def refusals(cell: Cell, context: dict, version: str | None) -> tuple[list[str], bool]:
    """(what a clear refusal at start says, as regular expressions; whether the case requires one)."""
    patterns, required = [], False
    for rule in cell.case.expect:
        if rule.refuse is not None and when_matches(rule.when, context):
            names = rule.refuse.names
            patterns += [p for name, versions, pats in vllm_compat.SIGNATURES
                         if any(vllm_compat.signature_matches(n, name) for n in names)
                         and vllm_compat.version_matches(version, versions) for p in pats]
            required = required or not rule.refuse.optional
    return list(dict.fromkeys(patterns)), required


def observation_of(record: JudgedRecord | None, has_layer_checks: bool, has_oracle: bool) -> str:
    """What a failing record failed on (its crash, a layer, the tokens against the oracle); without a record, the
    cell's strongest check: tokens where it has an oracle, else its layers, else whether it runs."""
    if record is not None:
        unmet = " ".join(e.get("rule", "") for e in record.get("expectations") or [] if not e.get("ok"))
        if record.get("error_tail") or record.get("crash"):
            return "runs"
        if "tokens" in unmet and has_oracle:
            return "tokens"
        if "layers" in unmet and has_layer_checks:
            return "layers"
    return "tokens" if has_oracle else "layers" if has_layer_checks else "runs"


def minimal_spec(task: Task, models: dict[str, ModelEntry], cache_dir: Path, version: str | None,
                 observe: str | None = None, weights: bool | None = None, record: JudgedRecord | None = None
                 ) -> dict[str, Any]:
    """Everything the script holds as data, for `task` (a cell on a class), observing `observe` (default: what the
    record failed on, else the cell's strongest check); `weights` (default: only for `tokens`)."""
    cell, gpu = task.cell, task.gpu
    built = build_models([task], models, cache_dir)
    missing = [n for n in models_needed(cell) if n not in built]
    if missing:
        raise ReproError(f"{cell.cell_id}: {missing[0]} has no tiny build that a script can write (trained or hub "
                         "only)")
    target, draft = cell.model, cell.axes["speculative"]
    draft_is_target = bool(draft) and built[draft] == built[target]
    local = {target: Path(MODEL)} | ({draft: Path(MODEL if draft_is_target else DRAFT)} if draft else {})
    args = engine_args_for(cell, gpu, models, local, vllm_version=version)
    context = cell.context(task.gpu_name, gpu, version, emulated=False)
    config = checkpoint_data(built[target], False)["config"]
    draft_data = checkpoint_data(built[draft], False) if draft and not draft_is_target else None
    method = models[draft].draft.method if draft and models[draft].draft else None
    target_layers = int(config["num_hidden_layers"])
    checks = layer_checks(cell, context, target_layers, target_layers + _draft_layers(draft_data, method, config))
    oracle = oracle_args(task, models, local, version, weights)
    observe = observe or observation_of(record, bool(checks), oracle is not None)
    if observe not in OBSERVATIONS:
        raise ReproError(f"observation {observe!r}: use one of {', '.join(OBSERVATIONS)}")
    if observe == "tokens" and oracle is None:
        raise ReproError(f"{cell.cell_id} has no oracle on {task.gpu_name} to compare its tokens with")
    if observe == "layers" and not checks:
        raise ReproError(f"{cell.cell_id}: no layer rule of its case applies on {task.gpu_name}")
    weights = observe == "tokens" if weights is None else weights
    patterns, required = refusals(cell, context, version)
    spec: dict[str, Any] = {
        "cell": cell.cell_id, "gpu_class": task.gpu_name, "observe": observe, "weights": weights,
        "env": {**vllm_compat.IN_PROCESS_ENGINE_ENV, **cell.case.env}, "emulate": emulation(gpu),
        "model": checkpoint_data(built[target], weights), "draft": None,
        "engine_args": own_engine_args(args, draft_is_target, weights),
        "prompts": prompt_ids(built[target], list(cell.case.generate.prompts)),
        "max_tokens": cell.case.generate.max_tokens, "refusals": patterns, "refusal_required": required,
    }
    if draft and not draft_is_target:
        spec["draft"] = checkpoint_data(built[draft], weights)
    if observe == "layers":
        spec["checks"] = checks
    if observe == "tokens":
        spec["oracle"] = oracle
    return spec


def _draft_layers(draft_config: dict | None, method: str | None, target_config: dict) -> int:
    """Attention layers a draft adds, numbered after the target's: an MTP draft's are the checkpoint's MTP layers."""
    if method == "mtp":
        return int(target_config.get("num_nextn_predict_layers", 1))
    return int(draft_config["config"]["num_hidden_layers"]) if draft_config else 0


def oracle_args(task: Task, models: dict[str, ModelEntry], local: dict[str, Path], version: str | None,
                weights: bool | None) -> dict[str, Any] | None:
    """A differential cell's oracle (the same configuration eager and plain) with the case's tolerances; None for
    a cell compared with none on this class, or one whose workload builds its own prompts."""
    cell = task.cell
    if cell.oracle_on(task.gpu_name) is None or cell.case.differential is False or cell.axes["workload"] != "plain":
        return None
    rule = cell.case.differential
    twin = Cell(cell.oracle_on(task.gpu_name) or "", cell.case,
                {**cell.axes, "execution": rule.oracle.execution, "workload": rule.oracle.workload},
                cell.gpu_classes)
    args = engine_args_for(twin, task.gpu, models, local, vllm_version=version)
    return {"cell": twin.cell_id, "engine_args": own_engine_args(args, False, weights is not False),
            "top_logprobs": rule.top_logprobs, "tie_tolerance": rule.tie_tolerance}
