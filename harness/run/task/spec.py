"""From a cell to what its process is told (`cell_spec`, SPEC.json): exactly the keyword arguments given to
`vllm.LLM`, its generation and workload, and the oracle's tokens it decodes teacher-forced.

Layers, later ones winning: the harness's base (small, deterministic, eager), the GPU class's engine defaults (KV
cache sized in bytes), the model registry entry, the case's `engine_args`, then the cell's axes, each by its route
(matrix/axes.py AXIS_TABLE, ENGINE_ROUTES here): its own engine argument, the draft's speculative_config, the
execution mode as the class runs it (harness/vllm_compat/execution.py) and the workload's runtime settings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from kvmatrix.harness.cell.spec import AccuracySpec, CellSpec
from kvmatrix.harness.record.parts import Mode
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.accuracy import accuracy_spec
from kvmatrix.harness.run.task.speculative import needs_draft_checkpoint, speculative_config
from kvmatrix.harness.vllm_compat import (
    PROBE_ONLY_ARG_NAMES,
    SMALLEST_KV_BLOCK_TOKENS,
    execution_engine_args,
    for_version,
    probe_only_engine_args,
)
from kvmatrix.harness.vllm_compat.forcing import forcing_method
from kvmatrix.matrix.axes import AXIS_BY_NAME, AXIS_TABLE, Axis, resolved_execution
from kvmatrix.matrix.combinations import case_values
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.expectations import Differential
from kvmatrix.matrix.schema import GpuClass, ModelEntry

BASE_ENGINE_ARGS: dict[str, Any] = {
    "dtype": "bfloat16",
    "max_model_len": 256,
    "enforce_eager": True,
    "seed": 0,
}


# A probe-only cell generates this much: the second token is the first decode step, so a configuration that
# starts and prefills but breaks at decode (CPU MLA with an fp8 cache) still crashes as it does in full.
PROBE_ONLY_MAX_TOKENS = 2


def model_source(entry: ModelEntry, built: Mapping[str, Path], name: str, use_hub: bool) -> dict[str, Any]:
    """`model` (and tokenizer) for an entry: its hub id with `use_hub`, else its tiny local build."""
    if use_hub and entry.hub_id:
        if entry.hub_id.startswith(("/", "./", "../", "~")) and not Path(entry.hub_id).expanduser().exists():
            raise KeyError(f"model {name!r}: its hub_id {entry.hub_id!r} (the model registry, _models.yaml) is a "
                           "folder that does not exist")
        return {"model": entry.hub_id, **entry.hub_engine_args}
    if name not in built:
        raise KeyError(f"model {name!r} has no local build (tiny builder: {entry.tiny!r})")
    return {"model": str(built[name]), "tokenizer": str(built[name])}


def engine_args_for(
    cell: Cell, gpu: GpuClass, models: dict[str, ModelEntry], built: Mapping[str, Path], use_hub: bool = False,
    probe: bool = False, vllm_version: str | None = None,
) -> dict[str, Any]:
    """`probe`: shrunk to one short request (probe-only mode), with vLLM `vllm_version`'s argument names."""
    entry = models[cell.model]
    args: dict[str, Any] = {**BASE_ENGINE_ARGS, **gpu.engine_defaults, **entry.engine_args}
    args.update(model_source(entry, built, cell.model, use_hub))
    args.update(cell.case.engine_args)
    if runs_workloads(cell) and "max_model_len" not in cell.case.engine_args:
        args["max_model_len"] = max(args["max_model_len"], WORKLOAD_MAX_MODEL_LEN)
    if probe:
        args.update(probe_only_engine_args(args["max_model_len"], vllm_version))
    cell_engine = CellEngine(cell, gpu, models, built, use_hub, vllm_version)
    for axis in AXIS_TABLE:  # the workload last: its arguments win over probe-only's
        ENGINE_ROUTES[axis.engine](args, axis, cell.axes[axis.name], cell_engine)
    return args


class CellEngine(NamedTuple):
    """What a route needs besides the axis's value: the cell, its class, the models and the release."""

    cell: Cell
    gpu: GpuClass
    models: dict[str, ModelEntry]
    built: Mapping[str, Path]
    use_hub: bool
    vllm_version: str | None


def _argument(args: dict[str, Any], axis: Axis, value: Any, _: CellEngine) -> None:
    args[axis.engine_field or axis.name] = list(value) if isinstance(value, list) else value


def _argument_if_set(args: dict[str, Any], axis: Axis, value: Any, on: CellEngine) -> None:
    if value != axis.default:
        _argument(args, axis, value, on)


def _attention_config(args: dict[str, Any], axis: Axis, value: Any, _: CellEngine) -> None:
    if value is not None:
        args["attention_config"] = {**args.get("attention_config", {}), axis.engine_field: value}


def _draft(args: dict[str, Any], _: Axis, value: Any, on: CellEngine) -> None:
    if value:
        draft = on.models[value]
        source = model_source(draft, on.built, value, on.use_hub) if needs_draft_checkpoint(draft) else None
        args["speculative_config"] = speculative_config(on.cell, on.models, source)  # with the draft_field axes
        args["disable_log_stats"] = False  # vLLM keeps its spec-decode counters (the acceptance) only with stats


def _in_speculative_config(args: dict[str, Any], axis: Axis, value: Any, on: CellEngine) -> None:
    """A draft's own setting: the `draft` route writes it into speculative_config."""


def _execution(args: dict[str, Any], _: Axis, value: Any, on: CellEngine) -> None:
    execution = resolved_execution(value, on.gpu.device)
    args.update(execution_engine_args(execution, on.vllm_version, args.get("compilation_config")))


def _workload(args: dict[str, Any], _: Axis, value: Any, on: CellEngine) -> None:
    args.update(workload_plan(value, args["max_model_len"], on.vllm_version)[0])


# How each axis reaches vLLM's engine arguments, by its route (matrix/axes.py EngineRoute says what each does).
ENGINE_ROUTES: dict[str, Callable[[dict[str, Any], Axis, Any, CellEngine], None]] = {
    "argument": _argument, "argument_if_set": _argument_if_set, "attention_config": _attention_config,
    "draft": _draft, "draft_field": _in_speculative_config, "execution": _execution, "workload": _workload,
}


# A case that varies the workload gives all its cells (oracles included) this context: the shared prefix covers
# 2 blocks of 128 tokens on a CPU (vLLM's CPU attention block) and 16 more, the chunked prompt 3 chunks.
WORKLOAD_MAX_MODEL_LEN = 512
CHUNK_TOKENS = 64  # max_num_batched_tokens of a chunked_prefill cell
CHUNKED_SEQUENCES = 4  # vLLM wants max_num_seqs <= max_num_batched_tokens


def runs_workloads(cell: Cell) -> bool:
    """Does any cell of the cell's case run a workload other than the default?"""
    return any(w != AXIS_BY_NAME["workload"].default for w in case_values(cell.case, "workload"))


def workload_plan(workload: str, max_model_len: int, vllm_version: str | None
                  ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the engine arguments a workload needs, the parameters the cell process builds its prompts from; None for
    `plain`). Preemption: a KV cache of as many blocks as a probe-only engine's for one group (one max_model_len
    sequence of the base context in 16-token blocks, and 2), and one more sequence than blocks. The parameters
    depend on the case's context only, so an oracle of the same case generates the same prompts."""
    if workload == "plain":
        return {}, None
    names = for_version(PROBE_ONLY_ARG_NAMES, vllm_version)[0]
    args: dict[str, Any] = {"disable_log_stats": False}  # vLLM's counters (preemptions) are kept only with stats
    params: dict[str, Any] = {"name": workload}
    if workload == "shared_prefix":
        args["enable_prefix_caching"] = True
    elif workload == "chunked_prefill":
        args.update({"enable_chunked_prefill": True, names["batched_tokens"]: CHUNK_TOKENS,
                     names["sequences"]: CHUNKED_SEQUENCES})
        params["chunk_tokens"] = CHUNK_TOKENS
    elif workload == "preemption":
        # Its prompts are one block each: the base context suffices, and halves the sequences a 512 one needs.
        length = min(max_model_len, BASE_ENGINE_ARGS["max_model_len"])
        blocks = -(-length // SMALLEST_KV_BLOCK_TOKENS) + 2
        args.update({"max_model_len": length, names["kv_blocks"]: blocks, names["sequences"]: blocks + 1})
        params["sequences"] = blocks + 1
    return args, params


def cell_mode(cell: Cell, probe_only: bool) -> tuple[Mode, str | None]:
    """("probe" or "full", why a cell runs in full although the run is probe-only). Only cells that need the
    resolved state alone may probe: an accuracy cell needs the whole engine for lm-eval."""
    if not probe_only:
        return "full", None
    if cell.case.accuracy is not None:
        return "full", "accuracy cell: runs in full under --probe-only"
    return "probe", None


def generation(cell: Cell, mode: str) -> dict[str, Any]:
    """The prompts and token count the cell process generates in this mode."""
    prompts, max_tokens = cell.case.generate.prompts, cell.case.generate.max_tokens
    if mode == "probe":
        return {"prompts": prompts[:1], "max_tokens": min(max_tokens, PROBE_ONLY_MAX_TOKENS)}
    return {"prompts": prompts, "max_tokens": max_tokens}


def cell_spec(task: Task, settings: RunSettings, engine_args: dict[str, Any], mode: str) -> CellSpec:
    """What the runner tells the cell process (SPEC.json)."""
    accuracy = accuracy_spec(task.cell, settings.use_hub)
    cell, version, length = task.cell, settings.vllm_version, engine_args["max_model_len"]
    differential = cell.case.differential
    paired = differential is not False and (cell.oracle_on(task.gpu_name) or cell.is_oracle_on(task.gpu_name))
    paired = paired or bool(cell.reference_on(task.gpu_name)) or cell.is_reference_on(task.gpu_name)
    top_logprobs = differential.top_logprobs if differential is not False and paired else None
    if top_logprobs is None and (cell.draft_twin or cell.twin_of_draft):  # the draft's greedy-equality pair
        top_logprobs = (differential or Differential()).top_logprobs
    oracle_id = cell.oracle_on(task.gpu_name) if differential is not False else None
    return CellSpec(
        forced_tokens=oracle_tokens(task, settings, oracle_id, mode) if oracle_id else None,
        forced_of=oracle_id,
        noise_floor=differential is not False and cell.is_oracle_on(task.gpu_name),
        forcing=forcing_method(version, task.gpu.device),
        workload=workload_plan(cell.axes["workload"], length, version)[1],
        references=[workload_plan(w, length, version)[1] for w in cell.references_on(task.gpu_name)],
        logprobs=top_logprobs,
        cell_id=task.cell.cell_id,
        engine_args=engine_args,
        **generation(task.cell, mode),
        emulate_capability=_capability(task),
        emulate_cpu_isa=task.gpu.cpu_isa if task.emulated_from and task.gpu.device == "cpu" else None,
        accuracy=AccuracySpec(**accuracy) if accuracy is not None else None,
    )


def oracle_tokens(task: Task, settings: RunSettings, oracle_id: str, mode: str) -> list[list[int]] | None:
    """The greedy tokens the cell's oracle generated for this cell's prompts (its own, or its plain reference run of
    this cell's workload), which the cell decodes teacher-forced (harness/cell/forced.py); None where the oracle
    has none in this run folder (it ran first: harness/run/task/accuracy.py) or ran in another mode."""
    oracle = settings.run_dir.read(oracle_id, task.gpu_name)
    if oracle is None or oracle.get("status") != "ok" or (oracle.get("mode") or "full") != mode:
        return None
    workload = task.cell.axes["workload"]
    source = oracle if workload == "plain" else (oracle.get("references") or {}).get(workload) or {}
    return source.get("tokens") or None


def _capability(task: Task) -> list[int] | None:
    if task.emulated_from is None or task.gpu.compute_capability is None:
        return None
    major, minor = task.gpu.compute_capability.split(".")
    return [int(major), int(minor)]
