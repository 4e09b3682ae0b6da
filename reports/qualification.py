"""A release qualification (harness/qualify/qualification.py as_data) as Markdown and HTML: the verdict first, in a
sentence a person reads in a minute, then each change with where it happened, the findings on the new release,
the waivers to change, and how the report was made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"), autoescape=True,
                          undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def verdict(data: dict[str, Any]) -> str:
    return f"FAIL: {'; '.join(data['fails'])}" if data["fails"] else "PASS: no new failure or error, no finding back"


def summary(data: dict[str, Any]) -> str:
    """One paragraph: what was compared and what moved."""
    old, new = data["old"]["ref"], data["new"]["ref"]
    counts = {s["name"]: len(s["changes"]) for s in data["sections"]}
    moved = [f"{counts['new_failures']} new failures", f"{counts['new_errors']} new errors", f"{counts['fixed']} fixed",
             f"{counts['changed']} with another resolved state", f"{counts['verdict_changed']} other verdict changes"]
    findings = [f"{sum(1 for f in data['findings'] if f['movement'] == m)} {m}" for m in
                ("fixed", "still there", "back", "shows", "no verdict")
                if any(f["movement"] == m for f in data["findings"])]
    waivers = [f"{sum(1 for w in data['waivers'] if w['action'] == a)} to {a}" for a in ("remove", "bound", "widen")
               if any(w["action"] == a for w in data["waivers"])]
    between = (f" (each verdict change bisected over {', '.join(data['between'])})" if data["between"] else
               f" (no release between them given: each change happened after {old}, by {new})")
    return (f"{data['compared']} cells of {', '.join(data['classes'])} ran on both {old} and {new}{between}: "
            + ", ".join(moved) + f"; {data['still_failing']} still failing, {data['unchanged']} unchanged. "
            + (f"Findings' scripts on {new}: {', '.join(findings)}. " if findings else "")
            + (f"Waivers: {', '.join(waivers)}." if waivers else "Waivers: nothing to change."))


def _md_cell(text: Any) -> str:
    return str(text if text is not None else "-").replace("|", "\\|").replace("\n", " ")


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows), ""]


def markdown(data: dict[str, Any]) -> str:
    old, new = data["old"]["ref"], data["new"]["ref"]
    lines = [f"# {data['title']}", "", f"**{verdict(data)}**", "", summary(data), ""]
    for section in data["sections"]:
        if not section["changes"]:
            continue
        lines += [f"## {section['title']} ({len(section['changes'])})", ""]
        bisected = any("where" in c for c in section["changes"])
        head = ["cell", "class", f"{old} → {new}", "what changed", *(["where"] if bisected else [])]
        lines += _table(head, [[f"`{c['cell']}`", c["gpu"], c["move"], c["detail"],
                                *([c.get("where", "-")] if bisected else [])] for c in section["changes"]])
    if data["findings"]:
        lines += [f"## Findings on {new}", "", "Each finding's standalone script run on the new release (exit 0: "
                  "vLLM does what it should; 1: the finding shows).", ""]
        lines += _table(["finding", f"on {old}", f"on {new}", "", "scripts"],
                        [[f"[{f['finding']}](../findings/README.md#{f['finding']})", f["old"], f["new"], f["movement"],
                          "; ".join(f"{s['gpu']}: exit {s['exit']}, {s['lines']} lines, {s['seconds']:.0f} s: "
                                    f"{s['said'][:140]}" for s in f["scripts"])] for f in data["findings"]])
    changes = [w for w in data["waivers"] if w["action"] in ("remove", "bound", "widen")]
    lines += ["## Waivers (cases/_waivers.txt)", ""]
    lines += _table(["waiver", "do", "why", "the line to write"],
                    [[w["where"], w["action"], w["why"], f"`{w['line']}`" if w["line"] else "(delete it)"]
                     for w in changes]) if changes else ["Nothing to change.", ""]
    moves = f" ({', '.join(sorted({c['move'] for c in data['appeared']}))})" if data["appeared"] else ""
    lines += ["## Cells in one run only", "", f"{len(data['appeared'])} cells are new in {new}'s run{moves}; "
              f"{data['not_in_run']} of {old}'s cells are not in it (not selected, or no longer in the matrix).",
              "", "## How this was made", "", *(f"- `{c}`" for c in data["commands"]),
              *(f"- {side}: {data[side]['run'] or data[side]['env']}" for side in ("old", "new")),
              f"- verdicts judged again under this checkout's cases and waivers, {data['made']}", ""]
    return "\n".join(lines)


def html(data: dict[str, Any]) -> str:
    return _ENV.get_template("qualification.html.j2").render(data=data, verdict=verdict(data), summary=summary(data))
