"""The `state` observation's text in a minimal reproducer (harness/repro/script.py writes the rest): read inside the
engine as kvmatrix's probe reads it (harness/cell/probe.py: each attention layer numbered by the first number in its
name, the drafter's own layers the draft; the attribute paths vLLM's releases use, from harness/vllm_compat, as
data), then each of the case's layers / groups / builders / page-size rules checked as kvmatrix's judge checks it
(harness/judge/verdict.py: the layers a rule selects, the groups or builders that hold them, each wanted value a
glob). Only what the cell's rules name is read: a script about the layers holds no builder code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvmatrix.harness import vllm_compat
from kvmatrix.harness.repro.generate import ReproError

# What the script reads of a layer for each field a layers rule may name (its index, role, page size always).
LAYER_READS = {
    "kv_cache_dtype": 'str(module.kv_cache_dtype)',
    "spec_dtype": 'str(getattr(spec, "dtype", None)).removeprefix("torch.")',
    "backend": 'module.get_attn_backend().get_name()',
    "group": 'groups.index(group)',
}
# The layer's scales, read where the record reads them (harness/vllm_compat LAYER_SCALE_ATTRS: the first attribute
# set); they are the checkpoint's only where the script writes its weights (rules.WEIGHTED_FIELDS).
SCALE_READ = 'float(next(v for a in {attrs!r} if (v := getattr(module, a, None)) is not None))'
# A value as the record writes it: a dtype without "torch.", an enum by its name.
PLAIN = 'getattr(v, "_name_", None) or str(v).removeprefix("torch.")'

RESOLVED = '''def resolved(worker):  # inside the engine, read as kvmatrix's record reads it
    first = lambda obj, key: next((v for v in (functools.reduce(lambda o, a: getattr(o, a, None), p.split("."), obj)
                                               for p in PATHS.get(key, [])) if v is not None), None)  # noqa: E731
    runner = first(worker, "runner")
    groups, draft = first(runner, "kv_cache_config").kv_cache_groups, set(first(runner, "draft") or ())
    state = {"layers": []}
    for name, module in first(runner, "forward_context").items():  # the attention layers, numbered as the record does
        if hasattr(module, "kv_cache_dtype"):
            group = next((g for g in groups if name in g.layer_names), None)
            spec = getattr(group, "kv_cache_spec", None)
            spec = (getattr(spec, "kv_cache_specs", None) or {}).get(name, spec)  # a group of per-layer specs
            number = re.search(r"(?:^|\\.)(\\d+)(?:\\.|$)", name)
            state["layers"].append({"layer_names": [name], "index": number and int(number[1]),
                                    "role": "draft" if name in draft else "target",
                                    "page_size_bytes": getattr(spec, "page_size_bytes", None)@READS@})
'''.rstrip("\n")

PLAIN = '''\
    plain = lambda v: getattr(v, "_name_", None) or str(v).removeprefix("torch.")  # noqa: E731 - as the record'''

GROUPS = '''\
    state["groups"] = [{f: plain(getattr(g.kv_cache_spec, f, None)) for c in CHECKS if c["rule"] == "groups"
                        for f in c["wanted"]} | {"layer_names": g.layer_names,
                                                 "spec_type": type(g.kv_cache_spec).__name__} for g in groups]'''

BUILDERS = '''\
    state["builders"] = [{f: plain(getattr(a.metadata_builders[0], f, None)) for c in CHECKS
                          if c["rule"] == "builders" for f in c["wanted"]} | {"layer_names": a.layer_names}
                         for subgroups in first(runner, "attn_groups") for a in subgroups]'''

CHOSEN = '''\
chosen = lambda select: [la for la in state["layers"] if la["role"] == select.get("role", la["role"])  # noqa
                        and (la["index"] in select["index"] if "index" in select else la["index"]
                             not in select.get("index_not", []))]'''

CHECK = '''wrong = []  # the layers a rule selects, as kvmatrix's judge selects them (by index or role), or the groups /
@CHOSEN@
for c in CHECKS if state else []:  # builders that hold them, each with the values the rule wants
    names = {la["layer_names"][0] for la in chosen(c["select"])}
    held = [x for x in state[c["rule"]] if names & set(x["layer_names"])]
    wrong += [f"no {c['rule']} of the layers {c['select']}"] if not held else [
        f"{c['rule']} of {x['layer_names']}: {f} {x.get(f)!r}" for x in held for f, w in c["wanted"].items()
        if not any(fnmatch.fnmatchcase(str(x.get(f)), str(v)) for v in w)]'''

RATIOS = '''for r in RATIOS if state else []:  # each side's one page size, as kvmatrix's judge divides them
    pages = [{la["page_size_bytes"] for la in chosen(r[side])} for side in ("of", "to")]
    if not all(len(p) == 1 and None not in p for p in pages) or abs(min(pages[0]) / min(pages[1]) - r["equals"]) > 1e-9:
        wrong.append(f"page sizes {pages[0]} / {pages[1]}, not {r['equals']}:1")'''


def selector(select: str | list[int], skipped: list[str]) -> dict[str, Any]:
    """A rule's selector as the script tests it: layer indices (as the record numbers them), indices left out, or a
    role. The judge counts a layer skipped when its number is one of the skip list's entries."""
    if isinstance(select, list):
        return {"index": select}
    numbers = [int(s) for s in skipped if s.isdigit()]
    words: dict[str, dict[str, Any]] = {"all": {}, "target": {"role": "target"}, "draft": {"role": "draft"},
                                        "skipped": {"index": numbers}, "not_skipped": {"index_not": numbers}}
    return words[select]


def paths(version: str | None, keys: set[str]) -> dict[str, list[str]]:
    """The attribute paths the probe reads, for this vLLM (harness/vllm_compat/engine.py), as data."""
    table: dict[str, Sequence[tuple[str, Sequence[str]]]] = {
        "runner": vllm_compat.MODEL_RUNNER_PATHS, "forward_context": vllm_compat.FORWARD_CONTEXT_PATHS,
        "kv_cache_config": vllm_compat.KV_CACHE_CONFIG_PATHS, "draft": vllm_compat.DRAFT_LAYER_NAME_PATHS,
        "attn_groups": vllm_compat.ATTN_GROUPS_PATHS}
    return {key: [p for alternatives in vllm_compat.for_version(rows, version) for p in alternatives]
            for key, rows in table.items() if key in keys}


def data(checks: list[dict[str, Any]], skipped: list[str], version: str | None, has_draft: bool) -> dict[str, Any]:
    """The state text's data: CHECKS (layers / groups / builders rules, whose fields the script reads), RATIOS
    (page-size rules), the attribute paths."""
    kinds = {c["rule"] for c in checks}
    keys = {"runner", "forward_context", "kv_cache_config", *(["draft"] if has_draft else []),
            *(["attn_groups"] if "builders" in kinds else [])}
    out: dict[str, Any] = {
        "CHECKS": [{**c, "select": selector(c["select"], skipped)} for c in checks if c["rule"] != "page_size_ratio"],
        "RATIOS": [{"of": selector(c["select"], skipped), "to": selector(c["to"], skipped), "equals": c["equals"]}
                   for c in checks if c["rule"] == "page_size_ratio"],
        "PATHS": paths(version, keys)}
    return {k: v for k, v in out.items() if v or k in ("CHECKS", "PATHS")}


def layer_reads(version: str | None) -> dict[str, str]:
    """What the script reads of a layer for each field a layers rule may name, for this vLLM."""
    scales = vllm_compat.for_version(vllm_compat.LAYER_SCALE_ATTRS, version)[0]
    return LAYER_READS | {field: SCALE_READ.format(attrs=tuple(attrs)) for field, attrs in scales.items()}


def functions(checks: list[dict[str, Any]], version: str | None) -> list[str]:
    """`resolved`, reading what the checks name; a layer field the script cannot read is an error."""
    fields = {f for c in checks if c["rule"] == "layers" for f in c["wanted"]} - {"index", "role", "page_size_bytes"}
    reads = layer_reads(version)
    unknown = sorted(fields - set(reads))
    if unknown:
        raise ReproError(f"a layers rule on {unknown[0]!r}: a minimal script does not read it; use --full")
    kinds = {c["rule"] for c in checks}
    reads_text = _packed([f'"{f}": {reads[f]}' for f in sorted(fields)], 36 + 56)
    extra = [PLAIN] * bool(kinds & {"groups", "builders"}) + [GROUPS] * ("groups" in kinds) + [BUILDERS] * (
        "builders" in kinds)
    return ["\n".join([RESOLVED.replace("@READS@", reads_text), *extra, "    return state"])]


def checks_text(checks: list[dict[str, Any]]) -> str:
    """The checks after the engine's state is read: CHECKS, then RATIOS where the cell has page-size rules."""
    return "\n".join([CHECK.replace("@CHOSEN@", CHOSEN), *([RATIOS] if any(c["rule"] == "page_size_ratio"
                                                                            for c in checks) else [])])


def _packed(items: list[str], column: int, indent: int = 36, width: int = 118) -> str:
    """Items appended to a line that reaches `column`, each after a comma, a new line where one would pass `width`."""
    out = ""
    for item in items:
        if column + len(item) + 2 > width:
            out, column = out + ",\n" + " " * indent + item, indent + len(item)
        else:
            out, column = out + ", " + item, column + len(item) + 2
    return out
