"""What a minimal reproducer needs to know of a cell, as data: the model's config (a draft's too; where weights
matter, the checkpoint's scalars), the engine arguments that are the cell's own, the prompts as token ids, and the
one observation the script asserts on, chosen by the kind of rule at stake (harness/repro/rules.py: `runs`, `crash`,
`state`, `tokens`).

Weights are vLLM's dummy ones (`load_format="dummy"`: config.json alone) unless the observation depends on them
(`tokens`, or a loader bug): then transformers draws a seeded random checkpoint of the architecture, and the tiny
checkpoint's scalars (its KV scales) are added by value. The script (harness/repro/script.py) holds every value here
as a Python literal checked to read back as itself."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvmatrix.harness import vllm_compat
from kvmatrix.harness.models.trained import BUILDERS as TRAINED_BUILDERS
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.repro import rules, state_text
from kvmatrix.harness.repro.generate import NeedsFullScript, ReproError, emulation
from kvmatrix.harness.run.model_builds import build_models, models_needed
from kvmatrix.harness.run.task.spec import engine_args_for
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.schema import ModelEntry

# Engine arguments the script sets itself (the model folder) or that change nothing a finding is about.
NOT_THE_CELLS_OWN = ("model", "tokenizer", "seed")
MODEL, DRAFT = "@MODEL@", "@DRAFT@"  # where the script's own model folders go


# Kept even where transformers' default is the same: what vLLM reads from the file itself.
CONFIG_KEPT = ("architectures", "model_type", "torch_dtype", "quantization_config")


def trimmed(config: dict[str, Any]) -> dict[str, Any]:
    """config.json without the keys whose value is transformers' default for the architecture (it fills them in
    again when vLLM loads the config); all of it for a model type transformers does not know."""
    try:
        from transformers import AutoConfig

        defaults = AutoConfig.for_model(config["model_type"]).to_dict()
    except (ImportError, KeyError, ValueError):
        return config
    return {k: v for k, v in config.items() if k in CONFIG_KEPT or k not in defaults or defaults[k] != v}


def checkpoint_data(folder: Path, weights: bool) -> dict[str, Any]:
    """config.json, and with `weights` the checkpoint's scalars by value (a kv_cache_scheme's scales): the script
    draws the rest with transformers. An FP8-weight checkpoint is left to `--full`, which writes it exactly."""
    out: dict[str, Any] = {"config": trimmed(json.loads((folder / "config.json").read_text()))}
    if not weights:
        return out
    path = folder / "model.safetensors"
    if not path.exists():
        raise ReproError(f"{folder.name} is config only: its weights are dummy, nothing to write")
    from safetensors import safe_open

    scalars = {}
    with safe_open(str(path), "pt") as stored:
        for name in stored.keys():
            tensor = stored.get_slice(name)
            if tensor.get_dtype() == "F8_E4M3":
                raise NeedsFullScript(f"{folder.name} has FP8 weights: the full script writes them exactly")
            if not tensor.get_shape():
                scalars[name] = float(stored.get_tensor(name).item())
    return {**out, "scalars": scalar_patterns(scalars)}


def draft_data(folder: Path, weights: bool) -> dict[str, Any]:
    """A draft's config.json, and with `weights` its tensors' names and shapes: the script draws them at random (a
    draft's own loader reads them; what a finding shows of a draft is not its trained values)."""
    out = checkpoint_data(folder, False)
    if not weights:
        return out
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as stored:
        if any(stored.get_slice(name).get_dtype() != "BF16" for name in stored.keys()):
            raise NeedsFullScript(f"{folder.name} holds other than bf16 tensors: the full script writes them exactly")
        return {**out, "tensors": {name: stored.get_slice(name).get_shape() for name in sorted(stored.keys())}}


def scalar_patterns(scalars: dict[str, float]) -> list[list]:
    """Scalars in few entries: [name with {} for its one number, value, [start, stop]] wherever consecutive
    numbers share a value (every layer's k_scale); a name without a number stands alone."""
    out: list[list] = []
    for name, value in sorted(scalars.items(), key=lambda item: _numbered(item[0])):
        pattern, number = _numbered(name)
        last = out[-1] if out else None
        if last and number is not None and last[:2] == [pattern, value] and last[2][1] == number:
            last[2][1] += 1
        else:
            out.append([pattern, value, [number, number + 1] if number is not None else [0, 1]])
    return out


def _numbered(name: str) -> tuple[str, int | None]:
    """(the name with its one number as {}, the number); names with several numbers or none stay whole."""
    numbers = re.findall(r"(?<=\.)\d+(?=\.)", name)
    if len(numbers) != 1:
        return name.replace("{", "{{").replace("}", "}}"), None
    return re.sub(r"(?<=\.)\d+(?=\.)", "{}", name.replace("{", "{{").replace("}", "}}")), int(numbers[0])


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


def observation_of(record: JudgedRecord | None, needs: set[str]) -> str:
    """What a failing record failed on (rules.failed_observation), where the cell's rules can show it; without a
    record (or a record that failed on nothing the script observes), the cell's strongest check: tokens, its state,
    its known crash, else whether it runs."""
    failed = rules.failed_observation(record) if record is not None else None
    if failed is not None and (failed in needs or failed == "runs"):
        return failed
    return next((kind for kind in ("tokens", "state", "crash") if kind in needs), "runs")


@dataclass(frozen=True)
class Models:
    """The cell's checkpoints as the script writes them: the target's folder, a draft's (None: no draft, or an MTP
    draft that is the target's own checkpoint), and the draft's method."""
    target: Path
    draft: Path | None
    draft_is_target: bool
    draft_method: str | None


def models_of(task: Task, models: dict[str, ModelEntry], cache_dir: Path) -> tuple[Models, dict[str, Path]]:
    """The built checkpoints of the cell's models, and the folders its engine arguments name (placeholders the
    script fills in)."""
    cell = task.cell
    trained = [n for n in models_needed(cell) if models[n].tiny in TRAINED_BUILDERS]
    if trained:  # what such a cell shows is the task it learned (accuracy): random weights would not show it
        raise ReproError(f"{cell.cell_id}: {trained[0]} is trained, not drawn from a seed; a standalone script "
                         "cannot regenerate its weights")
    built = build_models([task], models, cache_dir)
    missing = [n for n in models_needed(cell) if n not in built]
    if missing:
        raise ReproError(f"{cell.cell_id}: {missing[0]} has no tiny build that a script can write (hub only)")
    target, draft = cell.model, cell.axes["speculative"]
    entry = models[draft].draft if draft else None
    same = draft is not None and built[draft] == built[target]
    own = [draft] if draft is not None and not same else []
    local = {target: Path(MODEL)} | ({draft: Path(MODEL if same else DRAFT)} if draft else {})
    method = entry.method if entry else None
    return Models(built[target], built[own[0]] if own else None, same, method), local


def minimal_spec(task: Task, models: dict[str, ModelEntry], cache_dir: Path, version: str | None,
                 observe: str | None = None, weights: bool | None = None, record: JudgedRecord | None = None,
                 emulate: bool = True) -> dict[str, Any]:
    """Everything the script holds as data, for `task` (a cell on a class), observing `observe` (default: what the
    record failed on, else the cell's strongest check); `weights` (default: only for `tokens`); `emulate`: make
    vLLM decide as on the class (False where the script runs on a machine of that class)."""
    cell, gpu = task.cell, task.gpu
    built, local = models_of(task, models, cache_dir)
    context = cell.context(task.gpu_name, gpu, version, emulated=False)
    oracle = oracle_args(task, models, local, version, weights)
    needs = rules.observations(cell, context) | ({"tokens"} if oracle is not None else set())
    observe = _checked_observation(observe or observation_of(record, needs), task, needs)
    draft_needs_weights = built.draft is not None and built.draft_method in vllm_compat.DRAFT_METHODS_NEEDING_WEIGHTS
    checks = rules.state_checks(cell, context) if observe == "state" else []
    if weights is None:  # a config-only model runs on dummy weights in its cells too; a DFlash draft never does
        weights = (observe == "tokens" or draft_needs_weights or rules.needs_weights(checks)) and (
            built.target / "model.safetensors").exists()
    patterns, required = rules.refusals(cell, context, version)
    spec: dict[str, Any] = {
        "cell": cell.cell_id, "gpu_class": task.gpu_name, "observe": observe, "weights": weights, "version": version,
        "env": {**vllm_compat.IN_PROCESS_ENGINE_ENV, **cell.case.env}, "emulate": emulation(gpu) if emulate else {},
        "model": checkpoint_data(built.target, weights),
        "draft": draft_data(built.draft, weights) if built.draft else None,
        "engine_args": own_engine_args(engine_args_for(cell, gpu, models, local, vllm_version=version),
                                       built.draft_is_target, weights),
        "prompts": prompt_ids(built.target, list(cell.case.generate.prompts)),
        "max_tokens": cell.case.generate.max_tokens, "refusals": patterns, "refusal_required": required,
    }
    if observe == "state":
        spec["checks"] = checks
        skipped = [str(s) for s in cell.axes["kv_cache_dtype_skip_layers"] or []]
        spec["state_data"] = state_text.data(spec["checks"], skipped, version, built.draft_method is not None)
    if observe == "crash":
        spec["crash"] = rules.known_crash(cell, context, version)
    if observe == "tokens":
        spec["oracle"] = oracle
    return spec


def _checked_observation(observe: str, task: Task, needs: set[str]) -> str:
    """`observe` where the cell's rules on its class hold something it checks (`runs` always does)."""
    if observe not in rules.OBSERVATIONS:
        raise ReproError(f"observation {observe!r}: use one of {', '.join(rules.OBSERVATIONS)}")
    if observe != "runs" and observe not in needs:
        what = {"tokens": "no oracle to compare its tokens with", "state": "no layers, groups, builders or page rule",
                "crash": "no known crash"}[observe]
        raise ReproError(f"{task.cell.cell_id} has {what} on {task.gpu_name}")
    return observe


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
