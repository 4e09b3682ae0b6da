"""The resolved state of two records compared (a differential cell and its oracle, differential.py): every layer's
KV dtype, backend, spec dtype, page size and group, every KV-cache group, every attention builder's dtypes. Two
executions of one configuration must resolve the same state; any difference is named."""

from __future__ import annotations

from kvmatrix.harness.record.types import KvGroup, OutcomeRecord

LAYER_STATE = ("kv_cache_dtype", "backend", "spec_dtype", "page_size_bytes", "group")
GROUP_STATE = ("layer_names", "spec_type", "dtype", "block_size", "page_size_bytes", "kv_quant_mode",
               "cache_dtype_str")


def state_differences(mine: OutcomeRecord, theirs: OutcomeRecord) -> list[str]:
    """Where two records' resolved state differs (empty: identical)."""
    return [*_layer_differences(mine, theirs), *_kv_group_differences(mine, theirs),
            *_attention_group_differences(mine, theirs)]


def _layer_differences(mine: OutcomeRecord, theirs: OutcomeRecord) -> list[str]:
    out: list[str] = []
    layers = {la["name"]: la for la in theirs.get("layers") or []}
    mine_layers = {la["name"]: la for la in mine.get("layers") or []}
    if set(layers) != set(mine_layers):
        out.append(f"layers {sorted(mine_layers)} vs the oracle's {sorted(layers)}")
    for name in sorted(set(layers) & set(mine_layers)):
        for field in LAYER_STATE:
            if mine_layers[name].get(field) != layers[name].get(field):
                out.append(f"{name}: {field} {mine_layers[name].get(field)!r}, oracle {layers[name].get(field)!r}")
    return out


def _kv_group_differences(mine: OutcomeRecord, theirs: OutcomeRecord) -> list[str]:
    out: list[str] = []
    groups: list[KvGroup] = theirs.get("kv_groups") or []
    mine_groups: list[KvGroup] = mine.get("kv_groups") or []
    if len(groups) != len(mine_groups):
        out.append(f"{len(mine_groups)} KV-cache groups, oracle {len(groups)}")
    for g, (a, b) in enumerate(zip(mine_groups, groups, strict=False)):
        for field in GROUP_STATE:
            if a.get(field) != b.get(field):
                out.append(f"kv group {g}: {field} {a.get(field)!r}, oracle {b.get(field)!r}")
    return out


def _attention_group_differences(mine: OutcomeRecord, theirs: OutcomeRecord) -> list[str]:
    out: list[str] = []
    builders = {(x.get("group"), x.get("subgroup")): x for x in theirs.get("attn_groups") or []}
    for group in mine.get("attn_groups") or []:
        other = builders.get((group.get("group"), group.get("subgroup")))
        if other is None:
            out.append(f"attention group {group.get('group')}: not in the oracle")
            continue
        if group.get("backend") != other.get("backend"):
            out.append(f"attention group {group.get('group')}: backend {group.get('backend')!r}, oracle "
                       f"{other.get('backend')!r}")
        a, b = group.get("builder") or {}, other.get("builder") or {}
        for field in sorted((set(a) | set(b)) - {"module"}):
            if a.get(field) != b.get(field):
                out.append(f"{group.get('backend')} builder (group {group.get('group')}): {field} {a.get(field)!r}, "
                           f"oracle {b.get(field)!r}")
    return out
