"""What one record shows in a matrix cell, and the matrix itself (cells × GPU classes) as a pandas frame."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from kvmatrix.harness.judge.facts import facts
from kvmatrix.harness.record.parts import VERDICTS
from kvmatrix.harness.record.types import JudgedRecord


def cell_text(record: JudgedRecord) -> str:
    # A leak leaves the verdict as it is (the cell's results stand) but must catch the eye beside it.
    marker = ["LEAK"] if record.get("leak") else []
    parts = [record["verdict"].upper(), *marker] + [f"{k} {v}" for k, v in facts(record).items()]
    return " · ".join(parts)


def crash_counts(records: list[JudgedRecord]) -> Counter:
    """How many of these records share each fingerprint."""
    return Counter(r["fingerprint"] for r in records if r.get("fingerprint"))


def same_crash(record: JudgedRecord, counts: Counter, first_seen: dict[str, str] | None = None) -> str:
    """"same crash as 4 other cells; first seen <run>" for a failure (first seen: from the history database)."""
    fingerprint = record.get("fingerprint")
    return same_crash_text(counts[fingerprint] - 1, (first_seen or {}).get(fingerprint)) if fingerprint else ""


def same_crash_text(others: int, first_seen: str | None = None) -> str:
    parts = [f"same crash as {others} other cell{'s' if others > 1 else ''}"] if others > 0 else []
    if first_seen:
        parts.append(f"first seen {first_seen}")
    return "; ".join(parts)


def frame(records: list[JudgedRecord]) -> pd.DataFrame:
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
    return {v: int(got.get(v, 0)) for v in VERDICTS if got.get(v)}


def leaks(records: list[JudgedRecord]) -> list[str]:
    """One line per cell that left GPU memory behind (see harness/run/process/gpu_check.py)."""
    return [f"{r['cell_id']} on {r.get('gpu_class', '?')}: {r['leak']}" for r in records if r.get("leak")]


def fresh_rerun(record: JudgedRecord) -> str:
    """For a cell a warm worker ran to anything but a pass, so a fresh process ran it again (that run is the
    record): what the worker's run saw. A worker that saw a failure the fresh process does not see was polluted."""
    warm = record.get("warm_attempt")
    if not warm:
        return ""
    worker = warm.get("worker") or {}
    saw = warm.get("signature") or warm.get("status")
    # What the runs did, not their verdicts: a rejudge under newer rules (a waiver, a new signature) judges the
    # record again, not the warm attempt.
    same = warm.get("status") == record.get("status") and (
        record.get("status") == "ok" or any(warm.get(k) == record.get(k) for k in ("signature", "error_tail")))
    agreed = "same in a fresh process" if same else "NOT in a fresh process"
    retired = f"; worker retired: {worker['retired']}" if worker.get("retired") else ""
    return (f"warm worker {worker.get('pid')} (its cell {int(worker.get('cells_before') or 0) + 1}) saw "
            f"{str(warm.get('verdict')).upper()} ({saw}); {agreed}{retired}")


def fresh_reruns(records: list[JudgedRecord]) -> list[str]:
    return [f"{r['cell_id']} on {r.get('gpu_class', '?')}: {fresh_rerun(r)}" for r in records if r.get("warm_attempt")]
