"""What the HTML report's details panel shows for a clicked square, as the small JSON embedded in the page: per
record only what the panel shows (per-layer state, KV groups, builders' query dtypes, expectations, the error's
tail, links to the log and the findings page, a known vLLM failure's link and the rule to copy). Layer, group and
builder tables that several records share (the same configuration on several classes, or in several runs of a case)
are stored once, so a 10,000-cell page stays small."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.vllm_compat import QUERY_DTYPE_FIELDS
from kvmatrix.reports.findings_pages import page_name, unexplained
from kvmatrix.reports.html_grid import changed_nights
from kvmatrix.reports.summary import facts

LAYER_COLUMNS = ("name", "role", "backend", "kv_cache_dtype", "spec_dtype", "page_size_bytes", "k_scale", "v_scale")
GROUP_COLUMNS = ("group", "spec_type", "dtype", "block_size", "page_size_bytes", "layers")
BUILDER_COLUMNS = ("group", "backend", "class", "query dtypes", "cache_dtype")
ERROR_TAIL_CHARS = 1500


def _layers(record: JudgedRecord) -> list[list]:
    return [[la.get("name"), la.get("role", "target"), la.get("backend"), la.get("kv_cache_dtype"),
             la.get("spec_dtype"), la.get("page_size_bytes"), la.get("k_scale"), la.get("v_scale")]
            for la in record.get("layers") or []]


def _groups(record: JudgedRecord) -> list[list]:
    return [[g.get("group"), g.get("spec_type"), g.get("dtype"), g.get("block_size"), g.get("page_size_bytes"),
             len(g.get("layer_names") or [])] for g in record.get("kv_groups") or []]


def _builders(record: JudgedRecord) -> list[list]:
    out = []
    for g in record.get("attn_groups") or []:
        builder = g.get("builder") or {}
        queries = " / ".join(f"{k.removeprefix('q_data_type').strip('_') or 'q'} {str(dtype).replace('torch.', '')}"
                             for k in QUERY_DTYPE_FIELDS if (dtype := builder.get(k)))
        out.append([g.get("group"), g.get("backend"), builder.get("class"), queries or None,
                    str(builder.get("cache_dtype") or builder.get("kv_cache_dtype") or "") or None])
    return out


class _Shared:
    """Tables stored once: each distinct table gets an index into `tables`."""

    def __init__(self) -> None:
        self.tables: list[list] = []
        self._index: dict[tuple, int] = {}
        self.runs: dict[str, int] = {}

    def run(self, run_id: str) -> int:
        return self.runs.setdefault(run_id, len(self.runs))

    def ref(self, table: list[list]) -> int | None:
        if not table:
            return None
        key = tuple(tuple(str(x) if isinstance(x, (list, dict)) else x for x in row) for row in table)
        if key not in self._index:
            self._index[key] = len(self.tables)
            self.tables.append(table)
        return self._index[key]


def facts_text(record: JudgedRecord) -> str:
    return " · ".join(f"{k} {v}" for k, v in facts(record).items())


def _entry(record: JudgedRecord, shared: _Shared, run_prefix: str, finding: bool, shown: str,
           runs: list[tuple[str, str, str]]) -> dict:
    entry: dict[str, Any] = {
        "gpu": record.get("gpu_class", "?"), "v": record["verdict"],
        "reason": record.get("reason", ""),
        "facts": shown,
        "L": shared.ref(_layers(record)), "G": shared.ref(_groups(record)), "B": shared.ref(_builders(record)),
        "E": shared.ref([[e.get("rule"), bool(e.get("ok")), e.get("detail", "")]
                         for e in record.get("expectations") or []]),
    }
    if tail := record.get("error_tail"):
        entry["tail"] = tail[-ERROR_TAIL_CHARS:]
    if len(runs) > 1:
        entry["H"] = [[shared.run(run_id), verdict, resolved, "changed" if changed else ""]
                      for (run_id, verdict, resolved), changed in zip(runs, changed_nights(runs), strict=True)]
    if record.get("log"):
        entry["log"] = f"{run_prefix}{record['log']}"
    if finding:
        entry["finding"] = f"{run_prefix}findings/{quote(page_name(record))}"
    if note := record.get("known_failure"):
        entry["known"] = {k: note.get(k) for k in ("link", "page", "source", "rule") if note.get(k)}
    return {k: v for k, v in entry.items() if v not in (None, "", [])}


def details_json(records: list[JudgedRecord], run_prefix: str = "", shown: list[str] | None = None,
                 history: dict[tuple[str, str], list[tuple[str, str, str]]] | None = None) -> str:
    """The panel's data, indexed like `records`, as JSON safe inside a <script> element. `run_prefix`: the run
    folder relative to the page (logs and findings pages are named relative to it); `shown`: each record's
    facts_text where the caller has them already; `history`: (GPU class, cell id) → [(run id, verdict, resolved)]."""
    shared = _Shared()
    failures = {id(r) for r in unexplained(records)}
    shown = shown or [facts_text(r) for r in records]
    data = {
        "columns": {"L": LAYER_COLUMNS, "G": GROUP_COLUMNS, "B": BUILDER_COLUMNS},
        "records": [_entry(r, shared, run_prefix, id(r) in failures, text,
                           (history or {}).get((r.get("gpu_class") or "?", r["cell_id"])) or [])
                    for r, text in zip(records, shown, strict=True)],
        "tables": shared.tables,
        "runs": list(shared.runs),
    }
    text = json.dumps(data, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
