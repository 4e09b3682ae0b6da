"""What one record shows in a matrix cell, and the matrix itself (cells × GPU classes) as a pandas frame."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from harness.judge.fingerprint import failure_name

VERDICT_ORDER = ("fail", "error", "xfail", "pass", "skip")


def _unique(values) -> list:
    out = []
    for v in values:
        if v is not None and v not in out:
            out.append(v)
    return out


def facts(record: dict) -> dict[str, str]:
    """The resolved state in a few short strings: backend, KV dtype, query dtype, page size, and the failure's
    signature (else its fingerprint)."""
    layers = record.get("layers") or []
    out: dict[str, str] = {}
    for role, prefix in (("target", ""), ("draft", "draft ")):
        mine = [la for la in layers if la.get("role", "target") == role]
        if not mine:
            continue
        out[f"{prefix}backend"] = "/".join(_unique(la.get("backend") for la in mine))
        out[f"{prefix}kv"] = "/".join(_unique(la.get("kv_cache_dtype") for la in mine))
    queries = []
    for group in record.get("attn_groups") or []:
        builder = group.get("builder") or {}
        q = [builder.get(k) for k in ("q_data_type_prefill", "q_data_type_decode", "q_data_type")]
        q = [x.replace("torch.", "") for x in q if x]
        if q:
            queries.append("/".join(_unique(q)))
    if queries:
        out["q"] = ",".join(_unique(queries))
    # Per layer: a group of mixed specs (UniformTypeKVCacheSpecs) reports the sum of its layers' pages.
    pages = _unique(la.get("page_size_bytes") for la in layers)
    if not pages:
        pages = _unique(g.get("page_size_bytes") for g in record.get("kv_groups") or [])
    if pages:
        out["page"] = "/".join(str(p) for p in pages)
    out.update(_accuracy_facts(record))
    if name := failure_name(record):
        out["sig"] = name
    if record.get("emulated_from"):
        out["emulated"] = f"on {record['emulated_from']}"
    if record.get("mode") == "probe":
        out["mode"] = "probe"
    return out


def _accuracy_facts(record: dict) -> dict[str, str]:
    """The cell's score; against its baseline, the paired delta with its interval and the number of samples."""
    accuracy, versus = record.get("accuracy"), record.get("accuracy_vs_baseline") or {}
    if not accuracy:
        return {}
    if "delta" not in versus:
        return {"acc": f"{accuracy['score']:.3f} n={accuracy['n']}" + (f" ({versus['missing']})" if versus else "")}
    low, high = versus["interval"]
    return {"acc": f"{versus['score']:.3f}",
            "Δacc": f"{versus['delta']:+.3f} [{low:+.3f}, {high:+.3f}] n={versus['n']}",
            "same": f"{versus['identical_fraction']:.1%}"}


def cell_text(record: dict) -> str:
    # A leak leaves the verdict as it is (the cell's results stand) but must catch the eye beside it.
    marker = ["LEAK"] if record.get("leak") else []
    parts = [record["verdict"].upper(), *marker] + [f"{k} {v}" for k, v in facts(record).items()]
    return " · ".join(parts)


def crash_counts(records: list[dict]) -> Counter:
    """How many of these records share each fingerprint."""
    return Counter(r["fingerprint"] for r in records if r.get("fingerprint"))


def same_crash(record: dict, counts: Counter, first_seen: dict[str, str] | None = None) -> str:
    """"same crash as 4 other cells; first seen <run>" for a failure (first seen: from the history database)."""
    fingerprint = record.get("fingerprint")
    return same_crash_text(counts[fingerprint] - 1, (first_seen or {}).get(fingerprint)) if fingerprint else ""


def same_crash_text(others: int, first_seen: str | None = None) -> str:
    parts = [f"same crash as {others} other cell{'s' if others > 1 else ''}"] if others > 0 else []
    if first_seen:
        parts.append(f"first seen {first_seen}")
    return "; ".join(parts)


def frame(records: list[dict]) -> pd.DataFrame:
    """One row per record with the fields reports need."""
    rows = [
        {
            "cell_id": r["cell_id"],
            "case": r.get("case"),
            "gpu_class": r.get("gpu_class", "?"),
            "verdict": r["verdict"],
            "reason": r.get("reason", ""),
            "text": cell_text(r),
            "total_s": (r.get("timings") or {}).get("total_s"),
            "log": r.get("log"),
            "emulated_from": r.get("emulated_from"),
        }
        for r in records
    ]
    return pd.DataFrame(rows, columns=["cell_id", "case", "gpu_class", "verdict", "reason", "text", "total_s",
                                       "log", "emulated_from"])


def pivot(df: pd.DataFrame, value: str = "text") -> pd.DataFrame:
    """Rows: cells (in first-seen order); columns: GPU classes."""
    table = df.pivot_table(index="cell_id", columns="gpu_class", values=value, aggfunc="first")
    rows, columns = list(dict.fromkeys(df["cell_id"])), list(dict.fromkeys(df["gpu_class"]))
    return table.reindex(index=rows, columns=columns).fillna("")


def counts(df: pd.DataFrame) -> dict[str, int]:
    got = df["verdict"].value_counts().to_dict()
    return {v: int(got.get(v, 0)) for v in VERDICT_ORDER if got.get(v)}


def leaks(records: list[dict]) -> list[str]:
    """One line per cell that left GPU memory behind (see harness/run/gpu_check.py)."""
    return [f"{r['cell_id']} on {r.get('gpu_class', '?')}: {r['leak']}" for r in records if r.get("leak")]
