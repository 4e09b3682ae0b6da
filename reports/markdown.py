"""The matrix as plain Markdown, for CI logs and pull requests."""

from __future__ import annotations

import pandas as pd

from kvmatrix.harness.record.model import JudgedRecord
from kvmatrix.harness.record.parts import LISTED_VERDICTS
from kvmatrix.reports.phases import phase_lines
from kvmatrix.reports.summary import counts, crash_counts, frame, fresh_reruns, leaks, pivot, same_crash


def class_differences(records: list[JudgedRecord], reference: str) -> list[str]:
    """Per cell, how each other GPU class's record differs from the reference class's (verdict, backend, KV
    dtype, query dtype, page size, signature): what an emulated or other class decides differently."""
    from kvmatrix.harness.nightly.diff import what_changed  # reports stay importable without the history modules' deps

    by_class: dict[str, dict[str, JudgedRecord]] = {}
    for r in records:
        by_class.setdefault(r.get("gpu_class", "?"), {})[r["cell_id"]] = r
    ref = by_class.get(reference, {})
    lines = []
    for gpu, cells in by_class.items():
        if gpu == reference:
            continue
        for cell_id, other in cells.items():
            base = ref.get(cell_id)
            if base is None:
                continue
            # Emulation is said once per column, not as a difference of every cell.
            changes = [c for c in what_changed(base, other) if not c.startswith("emulated ")]
            if base["verdict"] != other["verdict"]:
                changes.insert(0, f"verdict {base['verdict']} → {other['verdict']}")
            if changes:
                lines.append(f"- `{cell_id}` {reference} → {gpu}: " + "; ".join(changes))
    return lines


def cells_per_tag(records: list[JudgedRecord]) -> pd.DataFrame:
    """Cells that ran (any verdict but skip) per case tag and GPU class, e.g. per regression class."""
    rows = [(tag, r["gpu_class"]) for r in records if r.get("verdict") != "skip" for tag in r.get("tags") or []]
    if not rows:
        return pd.DataFrame()
    counted = pd.DataFrame(rows, columns=["tag", "gpu_class"]).value_counts().unstack(fill_value=0)
    order = sorted(counted.index, key=lambda t: (t.rstrip("0123456789"), int("0" + t[len(t.rstrip("0123456789")):])))
    classes = list(dict.fromkeys(r["gpu_class"] for r in records))
    return counted.reindex(index=order, columns=classes, fill_value=0).rename_axis(columns=None)


def differential_lines(records: list[JudgedRecord]) -> list[str]:
    """One line per compared cell: the pair, its modes, what the comparison found (harness/judge/differential.py)."""
    out = []
    for r in records:
        d = r.get("differential")
        if not d:
            continue
        pair = (f"`{r['cell_id']}` ({d.get('mode')}) vs `{d.get('oracle')}` ({d.get('oracle_mode')}) on "
                f"{r.get('gpu_class')}")
        if d.get("missing"):
            found = f"not compared: {d['missing']}"
        elif d.get("crash"):
            found = d["crash"]
        else:
            parts = [f"state differs: {d['state'][0]}" if d.get("state") else "state identical",
                     (d.get("tokens") or {}).get("detail") or d.get("tokens_missing") or ""]
            found = "; ".join(p for p in parts if p)
        out.append(f"{r['verdict'].upper()} {pair}: {found}")
    return out


def render(records: list[JudgedRecord], title: str = "kvmatrix", header: str = "", compare_to: str | None = None,
           first_seen: dict[str, str] | None = None) -> str:
    """`first_seen` (fingerprint → run id, from the history database) dates each failure's crash."""
    df = frame(records)
    if df.empty:
        return f"# {title}\n\nNo cells.\n"
    total = ", ".join(f"{n} {v}" for v, n in counts(df).items())
    lines = [f"# {title}", ""]
    if header:
        lines += [header, ""]
    lines += [f"{len(df)} cells: {total}", ""]
    table = pivot(df).reset_index().rename(columns={"cell_id": "cell"})
    lines.append(table.to_markdown(index=False))
    per_tag = cells_per_tag(records)
    if not per_tag.empty:
        lines += ["", "## Cells per tag (skipped cells not counted)", "", per_tag.to_markdown()]
    lines += _section("Failures and expected failures", _problems(df, records, first_seen))
    lines += _section("Differential cells (each against its oracle: the same configuration run eager and plain)",
                      [f"- {line}" for line in differential_lines(records)])
    lines += _section("Leaks (GPU memory left behind after the cell ended)", [f"- {line}" for line in leaks(records)])
    lines += _section("Run again in a fresh process (a warm worker's run did not pass; the fresh run is the record)",
                      [f"- {line}" for line in fresh_reruns(records)])
    if compare_to:
        lines += _section(f"Differences from the {compare_to} column", class_differences(records, compare_to)
                          or ["- none"])
    lines += _section("Where the time went (each cell's wall time by phase, summed)", phase_lines(records))
    skipped = df[df["verdict"] == "skip"]
    lines += _section("Skipped", [f"- {len(group)} on {gpu}: {reason}" for (reason, gpu), group
                                  in skipped.groupby(["reason", "gpu_class"], sort=False)])
    return "\n".join(lines) + "\n"


def _section(heading: str, items: list[str]) -> list[str]:
    """A `##` section of the report, or nothing where it has no items."""
    return ["", f"## {heading}", "", *items] if items else []


def _problems(df: pd.DataFrame, records: list[JudgedRecord], first_seen: dict[str, str] | None) -> list[str]:
    """A line per failure and expected failure, with the other cells its crash was seen in."""
    problems = df[df["verdict"].isin(LISTED_VERDICTS)]
    if problems.empty:
        return []
    shared = crash_counts(records)
    notes = {(r["cell_id"], r.get("gpu_class", "?")): same_crash(r, shared, first_seen) for r in records}
    lines = []
    for row in problems.itertuples():
        note = notes.get((row.cell_id, row.gpu_class))
        lines.append(f"- **{row.verdict.upper()}** `{row.cell_id}` on {row.gpu_class}: {row.reason}"
                     + (f" ({note})" if note else ""))
    return lines
