"""Record fields vLLM renamed between releases: each release's record gets the current names too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from kvmatrix.harness.record.types import Builder, CellOutput
from kvmatrix.harness.vllm_compat.versions import for_version

CellOutputT = TypeVar("CellOutputT", bound=CellOutput)

# ---------------------------------------------------------------------------------------------------------------
# Record fields that were renamed: each release's record gets the current name too (the raw attribute stays), so
# an expectation naming `q_data_type_prefill` finds it on every release. Before 0.25 FlashInfer's builder planned
# prefill and decode with one `q_data_type` (v1/attention/backends/flashinfer.py); 0.25 split it in two.

# Every name a builder's query dtype was recorded under, across releases (what reports show as `q`).
QUERY_DTYPE_FIELDS = ("q_data_type_prefill", "q_data_type_decode", "q_data_type")
BUILDER_FIELD_ALIASES = [
    ("<0.25", {"q_data_type_prefill": "q_data_type", "q_data_type_decode": "q_data_type"}),
]


def normalized_builder(fields: Mapping[str, Any], version: str | None) -> Builder:
    """A metadata builder's recorded fields with the current names filled in from older ones where absent."""
    out: dict[str, Any] = dict(fields)
    for aliases in for_version(BUILDER_FIELD_ALIASES, version):
        for current, older in aliases.items():
            if out.get(current) is None and out.get(older) is not None:
                out[current] = out[older]
    return cast(Builder, out)


def normalized_record(record: CellOutputT) -> CellOutputT:
    """The record with the current field names on it, whatever release wrote it (records written before a rename
    are judged alike): a new record where a name is filled in, the input left as it is."""
    fields = cast(CellOutput, record)
    groups, version = fields.get("attn_groups"), fields.get("vllm_version")
    if not groups:
        return record
    return cast(CellOutputT, {**record, "attn_groups": [
        {**group, "builder": normalized_builder(builder, version)} if (builder := group.get("builder")) else group
        for group in groups]})
