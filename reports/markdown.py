"""The matrix as plain Markdown, for CI logs and pull requests."""

from __future__ import annotations

from reports.summary import counts, frame, pivot


def render(records: list[dict], title: str = "kvmatrix", header: str = "") -> str:
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
    skipped = df[df["verdict"] == "skip"]
    if not skipped.empty:
        lines += ["", "## Skipped", ""]
        for (reason, gpu), group in skipped.groupby(["reason", "gpu_class"], sort=False):
            lines.append(f"- {len(group)} on {gpu}: {reason}")
    return "\n".join(lines) + "\n"
