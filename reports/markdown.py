"""The matrix as plain Markdown, for CI logs and pull requests."""

from __future__ import annotations

import html

import pandas as pd

from kvmatrix.harness.record.parts import LISTED_VERDICTS
from kvmatrix.harness.record.types import DifferentialComparison, JudgedRecord
from kvmatrix.reports.phases import phase_lines
from kvmatrix.reports.summary import counts, crash_counts, frame, fresh_reruns, leaks, pivot, same_crash


def class_differences(records: list[JudgedRecord], reference: str) -> list[str]:
    """Per cell, how each other GPU class's record differs from the reference class's (verdict, backend, KV
    dtype, query dtype, page size, signature): what an emulated or other class decides differently."""
    from kvmatrix.harness.results.diff import what_changed  # reports stay importable without the history modules' deps

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
    rows = [(inline(tag), r["gpu_class"]) for r in records if r.get("verdict") != "skip" for tag in r.get("tags") or []]
    if not rows:
        return pd.DataFrame()
    counted = pd.DataFrame(rows, columns=["tag", "gpu_class"]).value_counts().unstack(fill_value=0)
    order = sorted(counted.index, key=lambda t: (t.rstrip("0123456789"), int("0" + t[len(t.rstrip("0123456789")):])))
    classes = list(dict.fromkeys(r["gpu_class"] for r in records))
    return counted.reindex(index=order, columns=classes, fill_value=0).rename_axis(columns=None)


TEXT_SHOWN = 48  # characters of each free-running text shown side by side
TEXTS_SHOWN = 2  # differing sequences shown per cell


def differential_lines(records: list[JudgedRecord]) -> list[str]:
    """One line per compared cell: the pair, its modes, what the comparison found (harness/judge/differential.py),
    and under it the free-running texts of the first sequences that differ from the oracle's, side by side."""
    by_id = {(r["cell_id"], r.get("gpu_class")): r for r in records}
    out = []
    for r in records:
        d = r.get("differential")
        if not d:
            continue
        pair = (f"`{r['cell_id']}` ({d.get('mode')}) vs `{d.get('oracle')}` ({d.get('oracle_mode')}) on "
                f"{r.get('gpu_class')}")
        out.append(f"{r['verdict'].upper()} {pair}: {_found(d)}")
        oracle = by_id.get((d.get("oracle") or "", r.get("gpu_class")))
        if oracle is not None and not (r.get("workload_run") or {}).get("name"):
            out += _texts_side_by_side(r.get("texts") or [], oracle.get("texts") or [])
    return out


def speculative_lines(records: list[JudgedRecord]) -> list[str]:
    """One line per draft cell: target and draft side by side (KV dtype, backend), its acceptance against its plain
    twin's, its greedy outputs against its no-draft twin's (harness/judge/speculative.py)."""
    out = []
    for r in records:
        run, versus = r.get("spec_decode"), r.get("speculative") or {}
        if run is None and not versus:
            continue
        sides = []
        for role in ("target", "draft"):
            layers = [la for la in r.get("layers") or [] if la.get("role", "target") == role]
            kv = "/".join(dict.fromkeys(str(la.get("kv_cache_dtype")) for la in layers)) or "-"
            backend = "/".join(dict.fromkeys(str(la.get("backend")) for la in layers)) or "-"
            sides.append(f"{role} {kv} {backend}")
        rate = (run or {}).get("acceptance_rate")
        accepted = (f"acceptance {rate:.2f} ({run.get('accepted_tokens')}/{run.get('draft_tokens')} draft tokens, "
                    f"mean length {run.get('mean_acceptance_length', 0):.2f})" if run and rate is not None
                    else f"acceptance {(run or {}).get('note') or 'none drafted'}")
        if versus.get("plain_acceptance_rate") is not None:
            accepted += f" vs {versus['plain_acceptance_rate']:.2f} on `{versus.get('plain_twin')}`"
        tokens = versus.get("tokens")
        greedy = (f"vs `{versus.get('twin')}`: {tokens['detail']}" if tokens
                  else f"not compared: {versus['missing']}" if versus.get("missing") else "")
        out.append(f"{r['verdict'].upper()} `{r['cell_id']}` on {r.get('gpu_class')}: {' · '.join(sides)} · "
                   f"{accepted}" + (f" · greedy {greedy}" if greedy else ""))
    return out


def _found(d: DifferentialComparison) -> str:
    if d.get("missing"):
        return f"not compared: {d['missing']}"
    if d.get("crash"):
        return d["crash"]
    answers = d.get("answers")
    parts = [f"state differs: {d['state'][0]}" if d.get("state") else "state identical",
             (d.get("teacher_forced") or {}).get("detail") or "",
             f"answers {answers['right']}/{answers['n']}, the oracle {answers['oracle_right']}/{answers['n']}"
             if answers else "",
             ("free-running: " if d.get("teacher_forced") else "")
             + ((d.get("tokens") or {}).get("detail") or d.get("tokens_missing") or "")]
    return "; ".join(p for p in parts if p and p != "free-running: ")


def _texts_side_by_side(mine: list[str], theirs: list[str]) -> list[str]:
    differing = [i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b][:TEXTS_SHOWN]
    return [f"  - sequence {i}: oracle `{theirs[i][:TEXT_SHOWN]!r}` · this cell `{mine[i][:TEXT_SHOWN]!r}`"
            for i in differing]


def known_failure_lines(records: list[JudgedRecord]) -> list[str]:
    """Each failure of a user's case that kvmatrix knows for this vLLM (harness/judge/known_failures.py): its link,
    what knows it, and the rule to copy into the case (under `expect:`; a waiver line for `_waivers.txt`)."""
    out = []
    for r in records:
        note = r.get("known_failure")
        if not note:
            continue
        page = f" (in this installation: {note['page']})" if note.get("page") else ""
        out += [f"- `{r['cell_id']}` on {r.get('gpu_class')}: {note.get('link')}{page}, known by kvmatrix's "
                f"{note.get('source')}:", "", "  ```yaml", *(f"  {line}" for line in note.get("rule", "").splitlines()),
                "  ```", ""]
    return out[:-1]


def waived_beyond_lines(records: list[JudgedRecord]) -> list[str]:
    """Each cell a waiver by finding waived beyond the cells it was written for (harness/judge/waivers.py): the
    finding, the waiver's line, so it is widened on purpose."""
    return [f"- `{r['cell_id']}` on {r.get('gpu_class')}: finding `{w.get('finding')}` ({w.get('link')}), by the "
            f"waiver at {w.get('waiver')}" for r in records if (w := r.get("waived") or {}).get("beyond")]


def render(records: list[JudgedRecord], title: str = "kvmatrix", header: str = "", compare_to: str | None = None,
           first_seen: dict[str, str] | None = None) -> str:
    """`first_seen` (fingerprint → run id, from the history database) dates each failure's crash."""
    df = frame(records)
    if df.empty:
        return f"# {title}\n\nNo cells.\n"
    df = df.assign(text=df["text"].map(inline), reason=df["reason"].map(inline))
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
    lines += _section("Known vLLM failures in these cases (kvmatrix's own cases or waivers know them; to expect one, "
                      "copy its rule into the case)", known_failure_lines(records))
    lines += _section("Waived by finding beyond the cells the waiver was written for (widen it, or file the finding "
                      "there)", waived_beyond_lines(records))
    lines += _section("Differential cells (each against its oracle: the same configuration run eager and plain)",
                      [line if line.startswith(" ") else f"- {line}" for line in differential_lines(records)])
    lines += _section("Speculative decoding (target and draft; acceptance against the plain twin: the same draft, auto "
                      "KV, eager; greedy outputs against the no-draft twin)",
                      [f"- {line}" for line in speculative_lines(records)])
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


def inline(text: object) -> str:
    """Text from a record (a reason quoting vLLM, a case's strings) as Markdown shows it and nothing more: markup
    escaped (a renderer would run `<img onerror=...>`), a `|` kept from splitting a table row, one line."""
    return " ".join(html.escape(str(text), quote=False).replace("|", "\\|").split())


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
