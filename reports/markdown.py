"""The matrix as plain Markdown, for CI logs and pull requests."""

from __future__ import annotations

from reports.summary import counts, frame, pivot


def class_differences(records: list[dict], reference: str) -> list[str]:
    """Per cell, how each other GPU class's record differs from the reference class's (verdict, backend, KV
    dtype, query dtype, page size, signature): what an emulated or other class decides differently."""
    from harness.diff import what_changed  # reports stay importable without the history modules' deps

    by_class: dict[str, dict[str, dict]] = {}
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


def render(records: list[dict], title: str = "kvmatrix", header: str = "", compare_to: str | None = None) -> str:
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
    problems = df[df["verdict"].isin(["fail", "error", "xfail"])]
    if not problems.empty:
        lines += ["", "## Failures and expected failures", ""]
        for row in problems.itertuples():
            lines.append(f"- **{row.verdict.upper()}** `{row.cell_id}` on {row.gpu_class}: {row.reason}")
    if compare_to:
        differences = class_differences(records, compare_to)
        lines += ["", f"## Differences from the {compare_to} column", ""]
        lines += differences or ["- none"]
    skipped = df[df["verdict"] == "skip"]
    if not skipped.empty:
        lines += ["", "## Skipped", ""]
        for (reason, gpu), group in skipped.groupby(["reason", "gpu_class"], sort=False):
            lines.append(f"- {len(group)} on {gpu}: {reason}")
    return "\n".join(lines) + "\n"
