"""What a record resolved, in a few short strings (backend, KV dtype, query dtype, page size, accuracy, the
failure's name): what the reports show in a matrix cell, and what diffs and bisection compare between records."""

from __future__ import annotations

from kvmatrix.harness.judge.fingerprint import failure_name
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.vllm_compat import QUERY_DTYPE_FIELDS


def _unique(values) -> list:
    out = []
    for v in values:
        if v is not None and v not in out:
            out.append(v)
    return out


def _query_dtypes(record: JudgedRecord) -> str:
    """The query dtypes each attention group's builder holds (FlashInfer's), one entry per distinct group."""
    queries = []
    for group in record.get("attn_groups") or []:
        builder = group.get("builder") or {}
        q = [str(x).replace("torch.", "") for x in (builder.get(k) for k in QUERY_DTYPE_FIELDS) if x]
        if q:
            queries.append("/".join(_unique(q)))
    return ",".join(_unique(queries))


def facts(record: JudgedRecord) -> dict[str, str]:
    """The resolved state in a few short strings: backend, KV dtype, query dtype, page size, and the failure's
    signature (else its fingerprint)."""
    layers = record.get("layers") or []
    out: dict[str, str] = {}
    for role, prefix in (("target", ""), ("draft", "draft ")):
        mine = [la for la in layers if la.get("role", "target") == role]
        if not mine:
            continue
        out[f"{prefix}backend"] = "/".join(_unique(la.get("backend") for la in mine))
        out[f"{prefix}kv"] = "/".join(_unique(la.get("kv_cache_dtype") for la in mine))
    if queries := _query_dtypes(record):
        out["q"] = queries
    # Per layer: a group of mixed specs (UniformTypeKVCacheSpecs) reports the sum of its layers' pages.
    pages = _unique(la.get("page_size_bytes") for la in layers)
    if not pages:
        pages = _unique(g.get("page_size_bytes") for g in record.get("kv_groups") or [])
    if pages:
        out["page"] = "/".join(str(p) for p in pages)
    out.update(_accuracy_facts(record))
    out.update(_speculative_facts(record))
    if name := failure_name(record):
        out["sig"] = name
    if record.get("emulated_from"):
        out["emulated"] = f"on {record['emulated_from']}"
    if record.get("mode") == "probe":
        out["mode"] = "probe"
    return out


def _accuracy_facts(record: JudgedRecord) -> dict[str, str]:
    """The cell's score; against its baseline, the paired delta with its interval and the number of samples."""
    accuracy, versus = record.get("accuracy"), record.get("accuracy_vs_baseline") or {}
    if not accuracy:
        return {}
    if "delta" not in versus:
        return {"acc": f"{accuracy['score']:.3f} n={accuracy['n']}" + (f" ({versus['missing']})" if versus else "")}
    low, high = versus["interval"]
    return {"acc": f"{versus['score']:.3f}",
            "Δacc": f"{versus['delta']:+.3f} [{low:+.3f}, {high:+.3f}] n={versus['n']}",
            "same": f"{versus['identical_fraction']:.1%}"}


def _speculative_facts(record: JudgedRecord) -> dict[str, str]:
    """A draft cell's acceptance (rate, accepted / drafted tokens, mean acceptance length, the plain twin's rate)
    and its greedy outputs against its no-draft twin's."""
    out: dict[str, str] = {}
    run, versus = record.get("spec_decode") or {}, record.get("speculative") or {}
    if run.get("acceptance_rate") is not None:
        plain = versus.get("plain_acceptance_rate")
        out["accept"] = (f"{run['acceptance_rate']:.2f} ({run.get('accepted_tokens')}/{run.get('draft_tokens')}, "
                         f"len {run.get('mean_acceptance_length', 0):.2f})"
                         + (f" plain {plain:.2f}" if plain is not None else ""))
    if tokens := versus.get("tokens"):
        out["=nodraft"] = f"{tokens['identical']}/{tokens['sequences']}" + ("" if tokens.get("ok") else " differs")
    return out
