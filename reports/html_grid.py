"""The HTML report's view of each case as a grid: rows are the case's KV-cache dtype × skipped layers, columns
its GPU classes × (speculative, attention backend, execution, workload) where the case varies them. Each square
is one record: its verdict's colour and a one-word mark (the failure's name, `differs` for a cell that disagrees
with its oracle, or the resolved KV dtype where it differs from the requested one), and given the history
database's verdicts, a strip of its cell's last runs. Pure data for the template (reports/templates/matrix.html.j2);
the square's details, shown when it is clicked, are in reports/html_details.py."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvmatrix.harness.judge.fingerprint import failure_name
from kvmatrix.harness.record.types import JudgedRecord

# (GPU class, cell id) → [(run id, verdict, resolved state)], oldest first (harness/results/history.py)
History = dict[tuple[str, str], list[tuple[str, str, str]]]
ROW_AXES = ("kv_cache_dtype", "kv_cache_dtype_skip_layers")
COLUMN_AXES = ("speculative", "attention_backend", "execution", "workload")  # shown only where the case varies them
_SHORT = {"kv_cache_dtype": "kv", "kv_cache_dtype_skip_layers": "skip", "speculative": "spec",
          "attention_backend": "attn", "execution": "exec", "workload": "wl"}


def axis_text(value) -> str:
    """An axis value as the cell ids spell it: skipped layers joined with `+`, none as `-`."""
    if isinstance(value, (list, tuple)):
        return "+".join(str(v) for v in value) or "-"
    return "-" if value in (None, "") else str(value)


# What a failed check's detail (harness/judge/verdict.py) says went wrong, in a word for its square.
_FAILED_CHECK = ((re.compile(r"^(?:rank \d+ )?\S+: (\w+) (?:is )?\S"), r"\1"),
                 (re.compile(r"no (\w+) recorded"), r"no \1"), (re.compile(r"^page size "), "page ratio"),
                 (re.compile(r"^forced attention backend"), "backend"), (re.compile(r"accuracy|drop"), "accuracy"),
                 (re.compile(r"^timed out"), "timeout"), (re.compile(r"^flaky"), "flaky"),
                 (re.compile(r"^expected .* got no crash|did not happen"), "ran"))


def failed_check(record: JudgedRecord) -> str | None:
    """A failure without a crash in a word: the field its first unmet check found wrong (`kv_cache_dtype`,
    `no q_data_type_prefill`, `page ratio`), else what its reason names (a timeout, a flaky pass, accuracy)."""
    texts = [e.get("detail") or "" for e in record.get("expectations") or [] if not e.get("ok")]
    for text in [*texts, record.get("reason") or ""]:
        for pattern, word in _FAILED_CHECK:
            if found := pattern.search(text):
                return found.expand(word)
    return None


def mark(record: JudgedRecord) -> str:
    """One word for a square: the failure's name (a crash's signature, a failed check's field); else the resolved
    KV dtype where it is not the requested one; else the verdict. A crash with no signature shows its fingerprint."""
    verdict = record["verdict"]
    if verdict == "skip":
        return "skip"
    name = failure_name(record)
    if verdict == "fail" and not name and (record.get("reason") or "").startswith("differential"):
        return "differs"  # from its oracle: the pair and how are in the reason and the details
    if name and verdict != "pass":
        return record["fingerprint"][:8] if name.startswith("crash ") and record.get("fingerprint") else name
    # Only a requested dtype that no target layer got: skipped layers keep another dtype by design.
    requested = axes_of(record).get("kv_cache_dtype")
    resolved = sorted({dtype for la in record.get("layers") or []
                       if la.get("role", "target") == "target" and (dtype := la.get("kv_cache_dtype"))})
    if requested not in (None, "auto") and resolved and requested not in resolved:
        return "kv " + "/".join(resolved)
    if verdict in ("fail", "xfail") and (check := failed_check(record)):
        return check
    return "LEAK" if record.get("leak") else verdict


@dataclass
class Grid:
    case: str
    row_axes: list[str]
    column_axes: list[str]  # "gpu" first, then the varied ones of COLUMN_AXES
    rows: list[tuple[str, ...]] = field(default_factory=list)
    columns: list[tuple[str, ...]] = field(default_factory=list)
    squares: dict[tuple[tuple[str, ...], tuple[str, ...]], int] = field(default_factory=dict)  # → record index

    def view(self, records: list[JudgedRecord], history: History | None = None) -> dict:
        """The template's view: header rows (one per column axis), and per row its squares (None: no record).
        `history`: each square's verdicts in its class's last runs (harness/results/history.py verdict_history),
        shown as a strip in the square."""
        header = [{"axis": _SHORT.get(axis, axis), "spans": _spans([c[: depth + 1] for c in self.columns])}
                  for depth, axis in enumerate(self.column_axes)]
        rows = []
        for row in self.rows:
            squares = [self._square(records, self.squares.get((row, column)), history or {}) for column in self.columns]
            label = (" · ".join(f"{_SHORT[a]} {v}" for a, v in zip(self.row_axes, row, strict=True))
                     if len(row) > 1 else row[0])
            rows.append({"label": label, "squares": squares,
                         "all_skip": all(s is None or s["verdict"] == "skip" for s in squares)})
        return {"case": self.case, "header": header, "rows": rows, "n": len(self.squares),
                "verdicts": sorted({records[i]["verdict"] for i in self.squares.values()})}

    @staticmethod
    def _square(records: list[JudgedRecord], index: int | None, history: History) -> dict | None:
        if index is None:
            return None
        r = records[index]
        runs = history.get((r.get("gpu_class") or "?", r["cell_id"])) or []
        return {"i": index, "verdict": r["verdict"], "mark": mark(r), "cell_id": r["cell_id"],
                "history": ([{"verdict": run[1], "changed": changed, "title": f"{run[0]}: {run[1]} {run[2]}"}
                             for run, changed in zip(runs, changed_nights(runs), strict=True)]
                            if len(runs) > 1 else []),
                "title": f"{r.get('gpu_class', '?')}: {r['verdict'].upper()} {r.get('reason', '')}",
                "emulated": bool(r.get("emulated_from")), "leak": bool(r.get("leak"))}


def changed_nights(runs: list[tuple[str, str, str]]) -> list[bool]:
    """For each night of a history strip: did its verdict or resolved state differ from the night before?"""
    return [i > 0 and runs[i][1:] != runs[i - 1][1:] for i in range(len(runs))]

def _spans(prefixes: list[tuple[str, ...]]) -> list[dict]:
    """Consecutive equal prefixes merged: one header cell spanning them, labelled by the prefix's last part."""
    spans: list[dict] = []
    for prefix in prefixes:
        if spans and spans[-1]["prefix"] == prefix:
            spans[-1]["span"] += 1
        else:
            spans.append({"prefix": prefix, "label": prefix[-1], "span": 1})
    return spans


def axes_of(record: JudgedRecord) -> dict:
    """The record's axes; for a record without them, as its cell id spells them (`case[kv=fp8,skip=0+3,...]`)."""
    if record.get("axes"):
        return dict(record["axes"])
    inside = record["cell_id"].partition("[")[2].rstrip("]")
    by_short = {short: axis for axis, short in _SHORT.items()}
    parts = dict(p.split("=", 1) for p in inside.split(",") if "=" in p)
    return {by_short[k]: v for k, v in parts.items() if k in by_short}


def _case_of(record: JudgedRecord) -> str:
    return record.get("case") or record["cell_id"].split("[", 1)[0]


def grids(records: list[JudgedRecord], gpus: list[str]) -> list[Grid]:
    """One grid per case, cases and rows in first-seen order, columns in `gpus` order then first-seen order."""
    by_case: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_case.setdefault(_case_of(r), []).append(i)
    out = []
    for case, indices in by_case.items():
        axes = [axes_of(records[i]) for i in indices]
        varied = [a for a in COLUMN_AXES if len({axis_text(x.get(a)) for x in axes}) > 1]
        grid = Grid(case, list(ROW_AXES), ["gpu", *varied])
        columns: dict[tuple[str, ...], None] = {}
        rows: dict[tuple[str, ...], None] = {}
        for i, ax in zip(indices, axes, strict=True):
            # A record without axes in any form (a case that did not load) is a row of its own, named by its id.
            row = tuple(axis_text(ax.get(a)) for a in ROW_AXES) if ax else (records[i]["cell_id"],)
            column = (records[i].get("gpu_class") or "?", *(axis_text(ax.get(a)) for a in varied))
            rows.setdefault(row)
            columns.setdefault(column)
            grid.squares.setdefault((row, column), i)
        order = {g: n for n, g in enumerate(gpus)}
        grid.rows = list(rows)
        grid.columns = sorted(columns, key=lambda c: order.get(c[0], len(order)))  # stable: first-seen within
        out.append(grid)
    return out
