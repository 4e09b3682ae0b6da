"""From a cell to exactly the keyword arguments given to `vllm.LLM`.

Layers, later ones winning: the harness's base (small, deterministic, eager: the matrix probes resolved state,
it does not measure speed), the GPU class's engine defaults (KV cache sized in bytes), the model registry entry,
the case's `engine_args`, then the cell's axes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matrix.expand import Cell
from matrix.schema import GpuClass, ModelEntry

BASE_ENGINE_ARGS: dict[str, Any] = {
    "dtype": "bfloat16",
    "max_model_len": 256,
    "enforce_eager": True,
    "seed": 0,
}


def model_source(entry: ModelEntry, built: dict[str, Path], name: str, use_hub: bool) -> dict[str, Any]:
    """`model` (and tokenizer) for an entry: its hub id with `use_hub`, else its tiny local build."""
    if use_hub and entry.hub_id:
        return {"model": entry.hub_id, **entry.hub_engine_args}
    if name not in built:
        raise KeyError(f"model {name!r} has no local build (tiny builder: {entry.tiny!r})")
    return {"model": str(built[name]), "tokenizer": str(built[name])}


def engine_args_for(
    cell: Cell, gpu: GpuClass, models: dict[str, ModelEntry], built: dict[str, Path], use_hub: bool = False
) -> dict[str, Any]:
    entry = models[cell.model]
    args: dict[str, Any] = {**BASE_ENGINE_ARGS, **gpu.engine_defaults, **entry.engine_args}
    args.update(model_source(entry, built, cell.model, use_hub))
    args.update(cell.case.engine_args)
    axes = cell.axes
    args["kv_cache_dtype"] = axes["kv_cache_dtype"]
    if axes["kv_cache_dtype_skip_layers"]:
        args["kv_cache_dtype_skip_layers"] = list(axes["kv_cache_dtype_skip_layers"])
    if axes["attention_backend"]:
        args["attention_config"] = {**args.get("attention_config", {}), "backend": axes["attention_backend"]}
    if axes["speculative"]:
        draft = models[axes["speculative"]]
        source = model_source(draft, built, axes["speculative"], use_hub)
        args["speculative_config"] = {
            "method": draft.draft.method,
            "model": source["model"],
            "num_speculative_tokens": draft.draft.num_speculative_tokens,
        }
    return args


def models_needed(cell: Cell) -> list[str]:
    return [cell.model] + ([cell.axes["speculative"]] if cell.axes["speculative"] else [])
