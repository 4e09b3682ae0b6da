"""The HTML report's view of each case as a grid: rows are the row axes of matrix/axes.py's table (KV-cache dtype ×
skipped layers), columns its GPU classes × every other axis whose value differs between the case's records (an
axis a record names that the table does not know, from a newer harness, too), so every record has a square of its
own. Each square is one record: its verdict's colour and a one-word mark (the failure's name, `differs` for a cell
that disagrees with its oracle, or the resolved KV dtype where it differs from the requested one), and given the
history database's verdicts, a strip of its cell's last runs. Pure data for the template
(reports/templates/matrix.html.j2); the square's details, shown when it is clicked, are in reports/html_details.py."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvmatrix.harness.judge.fingerprint import failure_name
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.matrix.axes import AXIS_TABLE, Axis, value_text, varied

# (GPU class, cell id) → [(run id, verdict, resolved state)], oldest first (harness/results/history.py)
History = dict[tuple[str, str], list[tuple[str, str, str]]]
ROW_AXES = tuple(axis for axis in AXIS_TABLE if axis.grid == "row")
COLUMN_AXES = tuple(axis for axis in AXIS_TABLE if axis.grid == "column")  # shown where the case's records differ
_SHORT = {axis.name: axis.id_key for axis in AXIS_TABLE}


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
    column_axes: list[str]  # "gpu" first, then the axes whose value differs between the case's records
    rows: list[tuple[str, ...]] = field(default_factory=list)
    columns: list[tuple[str, ...]] = field(default_factory=list)
    squares: dict[tuple[tuple[str, ...], tuple[str, ...]], int] = field(default_factory=dict)  # → record index

    def view(self, records: list[JudgedRecord], history: History | None = None) -> dict:
        """The template's view: header rows (one per column axis), and per row its squares (None: no record).
        `history`: each square's verdicts in its class's last runs (harness/results/history.py verdict_history),
        shown as a strip in the square."""
        names = {**_SHORT, _RUN.name: _RUN.id_key}
        header = [{"axis": names.get(axis, axis), "spans": _spans([c[: depth + 1] for c in self.columns])}
                  for depth, axis in enumerate(self.column_axes)]
        rows = []
        for row in self.rows:
            squares = [self._square(records, self.squares.get((row, column)), history or {}) for column in self.columns]
            label = (" · ".join(f"{_SHORT[a]} {v}" for a, v in zip(self.row_axes, row, strict=True))
                     if len(row) > 1 else row[0])
            rows.append({"label": label, "squares": squares,
                         "all_skip": all(s is None or s["verdict"] == "skip" for s in squares)})
        return {"case": self.case, "header": header, "rows": rows, "n": len(self.squares),
                "row_axes": " · ".join(_SHORT[a] for a in self.row_axes),
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


# Not an axis of the matrix: the run a record is from, a column where records of several runs (`kvmatrix report RUN
# RUN`) would otherwise share a square.
_RUN = Axis("run_id", "run", None, str, "argument")


def _column_axes(records: list[JudgedRecord], axes: list[dict]) -> list[Axis]:
    """The columns' axes of one case's grid: the table's whose value differs between its records, then the same of
    axes the table does not know (a newer harness's), then the run where records would still share a square."""
    unknown = dict.fromkeys(k for x in axes for k in x if k not in _SHORT)
    shown = varied(axes, COLUMN_AXES) + varied(axes, tuple(Axis(k, k, None, object, "argument") for k in unknown))
    places = {(r.get("gpu_class"), *_place(x, ROW_AXES), *_place(x, shown)) for r, x in zip(records, axes, strict=True)}
    if len(places) < len(records):
        shown += varied([{"run_id": r.get("run_id")} for r in records], (_RUN,))
    return shown


def _place(values: dict, shown: tuple[Axis, ...] | list[Axis]) -> tuple[str, ...]:
    return tuple(value_text(values.get(axis.name, axis.default)) for axis in shown)


def grids(records: list[JudgedRecord], gpus: list[str]) -> list[Grid]:
    """One grid per case, cases and rows in first-seen order, columns in `gpus` order then their values'. Every
    record is a square of its own: one that nothing places apart from another's is a row of its own."""
    by_case: dict[str, list[JudgedRecord]] = {}
    for r in records:
        by_case.setdefault(_case_of(r), []).append(r)
    index = {id(r): i for i, r in enumerate(records)}
    out = []
    for case, mine in by_case.items():
        axes = [axes_of(r) for r in mine]
        shown = _column_axes(mine, axes)
        grid = Grid(case, [a.name for a in ROW_AXES], ["gpu", *(a.name for a in shown)])
        columns: dict[tuple[str, ...], None] = {}
        rows: dict[tuple[str, ...], None] = {}
        for r, ax in zip(mine, axes, strict=True):
            # A record without axes in any form (a case that did not load) is a row of its own, named by its id.
            row = _place(ax, ROW_AXES) if ax else (r["cell_id"],)
            column = (r.get("gpu_class") or "?", *_place({**ax, "run_id": r.get("run_id")}, shown))
            if (row, column) in grid.squares:
                row = (f"{r['cell_id']} #{index[id(r)]}",)
            rows.setdefault(row)
            columns.setdefault(column)
            grid.squares[(row, column)] = index[id(r)]
        grid.rows = list(rows)
        grid.columns = _ordered(list(columns), gpus)
        out.append(grid)
    return out


def _ordered(columns: list[tuple[str, ...]], gpus: list[str]) -> list[tuple[str, ...]]:
    """Columns in `gpus` order, then by each axis's values in first-seen order: the columns of one value of an axis
    side by side, under one header cell."""
    ranks: list[dict[str, int]] = [{g: n for n, g in enumerate(gpus)}]
    for depth in range(1, len(columns[0]) if columns else 1):
        ranks.append({v: n for n, v in enumerate(dict.fromkeys(c[depth] for c in columns))})
    return sorted(columns, key=lambda c: tuple(rank.get(v, len(rank)) for rank, v in zip(ranks, c, strict=True)))
