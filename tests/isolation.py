"""What a cell must resolve alike whichever isolation ran it (a warm worker or a fresh process): its verdict and
outcome, what vLLM resolved (per-layer KV dtypes and backends, KV groups, builders) and its greedy tokens. Used by
the isolation-equality test and benchmark (benchmarks/warm_workers.py)."""

from __future__ import annotations

SAME_IN_EVERY_ISOLATION = ("verdict", "status", "signature", "worker_cache_dtype", "layers", "kv_groups",
                           "attn_groups", "tokens", "texts", "accuracy")


def isolation_differences(first: list[dict], second: list[dict]) -> list[str]:
    """One line per cell and field that differ between two runs of the same cells; cells in only one run too."""
    by_key = {(r["cell_id"], r.get("gpu_class")): r for r in second}
    lines = []
    for record in first:
        key = (record["cell_id"], record.get("gpu_class"))
        other = by_key.pop(key, None)
        if other is None:
            lines.append(f"{key[0]}: only in the first run")
            continue
        lines += [f"{key[0]}: {field} {record.get(field)!r:.200} != {other.get(field)!r:.200}"
                  for field in SAME_IN_EVERY_ISOLATION
                  if _comparable(record.get(field)) != _comparable(other.get(field))]
    lines += [f"{cell_id}: only in the second run" for cell_id, _ in by_key]
    return lines


def _comparable(value: object) -> object:
    """Accuracy results without their timings (a warm cell is faster, not different)."""
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items() if not k.endswith("_s")}
    return value
