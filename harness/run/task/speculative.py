"""A cell's `speculative_config`: the registry's draft entry (method, token count, its `config` fields), the case's
`speculative_config:` fields, then the cell's draft axes (the draft's own KV dtype and attention backend), later
ones winning; and why a release cannot run it (a field it lacks: a skip naming the field)."""

from __future__ import annotations

from typing import Any

from kvmatrix.harness.vllm_compat import missing_speculative_fields
from kvmatrix.matrix.axes import AXIS_TABLE
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.schema import MODEL_FREE_DRAFT_METHODS, ModelEntry


def draft_fields(cell: Cell, models: dict[str, ModelEntry]) -> dict[str, Any]:
    """Every field of the cell's speculative_config but `model` (which needs the built checkpoint), in the order
    given; empty for a cell without a draft."""
    name = cell.axes["speculative"]
    if not name:
        return {}
    draft = models[name].draft
    if draft is None:  # a KeyError: the cell's record is an error naming it (runner.run_attempt)
        raise KeyError(f"speculative model {name} has no draft section in the model registry")
    fields: dict[str, Any] = {"method": draft.method, "num_speculative_tokens": draft.num_speculative_tokens,
                              **draft.config, **cell.case.speculative_config}
    for axis in AXIS_TABLE:
        if axis.engine == "draft_field" and cell.axes.get(axis.name) is not None:
            fields[axis.engine_field] = cell.axes[axis.name]
    return fields


def speculative_config(cell: Cell, models: dict[str, ModelEntry], model_source: dict[str, Any] | None
                       ) -> dict[str, Any] | None:
    """The cell's speculative_config for vllm.LLM (None: no draft); `model_source`: the draft's `model` (its local
    build or hub id), None for a method that needs no model."""
    fields = draft_fields(cell, models)
    if not fields:
        return None
    if fields["method"] in MODEL_FREE_DRAFT_METHODS or model_source is None:
        return fields
    return {"method": fields["method"], "model": model_source["model"],
            **{k: v for k, v in fields.items() if k != "method"}}


def speculative_reason(cell: Cell, models: dict[str, ModelEntry], vllm_version: str | None) -> str | None:
    """Why the cell's release cannot take its speculative_config (a skip): the fields it lacks."""
    name = cell.axes["speculative"]
    if not name or models.get(name) is None or models[name].draft is None:
        return None
    missing = missing_speculative_fields(list(draft_fields(cell, models)), vllm_version)
    if not missing:
        return None
    return (f"vLLM {vllm_version}'s speculative_config has no field {', '.join(missing)} "
            f"(harness/vllm_compat/speculative.py): this release cannot set the draft's {', '.join(missing)}")


def needs_draft_checkpoint(entry: ModelEntry) -> bool:
    """A draft entry whose method proposes with a model of its own (a checkpoint to build or fetch)."""
    return entry.draft is None or entry.draft.method not in MODEL_FREE_DRAFT_METHODS
