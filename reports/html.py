"""The matrix as one self-contained HTML page for people: what changed since the baseline run at the top, then
a grid per case (reports/html_grid.py: KV dtype × skipped layers by GPU class × the case's other axes), each
square coloured by verdict with a one-word mark; a click on a square shows its record's details (per-layer state,
KV groups, builders, expectations, the error, links to its log and findings page: reports/html_details.py, JSON
embedded in the page, no server). Filters by case/cell and verdict (pre-set by `?cell=...&verdict=...` or the
same after `#`) and a toggle for skipped squares. Below, folded, every record as a list (cells × GPU classes)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import jinja2

from kvmatrix.harness.record.parts import VERDICTS
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.reports.diff_md import Comparison, detail, move
from kvmatrix.reports.html_details import details_json, facts_text
from kvmatrix.reports.html_grid import History, grids
from kvmatrix.reports.summary import crash_counts, fresh_rerun, fresh_reruns, leaks, same_crash

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True, undefined=jinja2.StrictUndefined,
)


# The legend: what each square's colour says (the verdicts, worst first as VERDICTS lists them).
LEGEND = {
    "fail": "vLLM did not do what the case expects, and no case rule or known failure explains it: look here",
    "error": "the cell could not be judged (a broken environment, a harness fault), never counted as a vLLM failure",
    "xfail": "a known vLLM failure: the case or a waiver expects it, with its link",
    "pass": "vLLM did what the case expects (or refused clearly where the case allows it)",
    "skip": "not run on this class (a skip rule, a platform's clear refusal, not emulable here)",
}


def render(records: list[JudgedRecord], title: str = "kvmatrix", header: str = "", log_prefix: str = "",
           diff: list[Comparison] | None = None, first_seen: dict[str, str] | None = None,
           history: History | None = None) -> str:
    """`first_seen` (fingerprint → run id, from the history database) dates each failure's crash; `history`
    (harness/results/history.py verdict_history) gives each square a strip of its last runs' verdicts."""
    gpus = list(dict.fromkeys(r.get("gpu_class", "?") for r in records))
    shown = [facts_text(r) for r in records]  # once per record: the list and the details panel show them
    got = Counter(r["verdict"] for r in records)
    return _ENV.get_template("matrix.html.j2").render(
        title=title, header=header, gpus=gpus, legend=[(v, LEGEND[v]) for v in VERDICTS if v in LEGEND],
        rows=_list_rows(records, shown, gpus, log_prefix, first_seen),
        n_cells=len(records), counts={v: got[v] for v in VERDICTS if got[v]}, verdicts=VERDICTS,
        diff=_diff_view(diff or []), leaks=leaks(records), reruns=fresh_reruns(records),
        grids=[g.view(records, history) for g in grids(records, gpus)],
        details=details_json(records, log_prefix, shown, history),
    )


def _list_rows(records: list[JudgedRecord], shown: list[str], gpus: list[str], log_prefix: str,
               first_seen: dict[str, str] | None) -> list[dict[str, Any]]:
    """The list view: one row per cell id, one entry per GPU class (None: no record there)."""
    shared = crash_counts(records)
    by_key = {(r["cell_id"], r.get("gpu_class", "?")): (r, text) for r, text in zip(records, shown, strict=True)}
    rows = []
    for cell_id in dict.fromkeys(r["cell_id"] for r in records):
        entries: list[dict[str, Any] | None] = []
        for gpu in gpus:
            r, text = by_key.get((cell_id, gpu), (None, ""))
            entries.append(None if r is None else {
                "verdict": r["verdict"],
                "reason": r.get("reason", ""),
                "facts": text,
                "log": f"{log_prefix}{r['log']}" if r.get("log") else None,
                "emulated_from": r.get("emulated_from"),
                "leak": r.get("leak"),
                "rerun": fresh_rerun(r),
                "same_crash": same_crash(r, shared, first_seen),
            })
        rows.append({"cell_id": cell_id, "entries": entries,
                     "verdicts": sorted({e["verdict"] for e in entries if e})})
    return rows


def _diff_view(comparisons: list[Comparison]) -> list[dict[str, Any]]:
    return [
        {"heading": comp.heading, "compared": comp.baseline is not None, "unchanged": comp.diff.unchanged,
         "empty": comp.diff.is_empty,
         "sections": [{"title": title, "changes": [
             {"cell_id": ch.cell_id, "verdict": ch.after or "absent", "move": move(ch), "detail": detail(ch)}
             for ch in changes]} for title, changes in comp.diff.sections()]}
        for comp in comparisons
    ]
