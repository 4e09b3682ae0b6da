"""The `state` observation's text in a minimal reproducer (harness/repro/script.py writes the rest): read inside the
engine as kvmatrix's probe reads it (harness/cell/probe.py: each attention layer numbered by the first number in its
name, the drafter's own layers the draft), then checked as kvmatrix's judge checks it (harness/judge/verdict.py: the
layers a rule selects, each wanted value a glob). The checks are data the script iterates over: CHECKS holds one row
per checked value (what, the attribute paths it is read at, the layers selected, the values wanted), so one loop reads
them in the engine and one checks them; a groups or builders rule is a value of the group or builder that holds each
selected layer. Only what the cell's rules name is read: a script about a layer's own dtype reads no KV group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvmatrix.harness import vllm_compat
from kvmatrix.harness.repro.generate import ReproError

# Where the script reads each field a layers rule may name, from the roots its reading loop sets for a layer: the
# attention module (`layer`), its own KV spec (`spec`), its group's index (`group_id`), its backend's name.
LAYER_PATHS = {"kv_cache_dtype": ["layer.kv_cache_dtype"], "spec_dtype": ["spec.dtype"],
               "page_size_bytes": ["spec.page_size_bytes"], "group": ["group_id"], "backend": ["backend"]}
ROW_FIELDS = ("role",)  # fields every layer's row holds (read with its name and index), no path needed
# The roots a layer's reading loop sets, each only where a path starts with it.
GROUP_ROOTS = ("spec", "group", "group_id")  # read from the KV-cache groups

# The engine's state as the script reads it: @SETUP@ and @ROOTS@ stand for the lines below a cell's checks need.
RESOLVED = """\
def resolved(worker):  # inside the engine: each attention layer (numbered by the first number in its name) with
    first = lambda obj, paths: next((v for v in (functools.reduce(lambda o, a: getattr(o, a, None), p.split("."), obj)
                                                 for p in paths) if v is not None), None)  # noqa: E731
@PLAIN@
    runner, layers = first(worker, PATHS["runner"]), []  # the values CHECKS name, as kvmatrix's record reads them
@SETUP@
    for name, layer in [(n, m) for n, m in first(runner, PATHS["layers"]).items() if hasattr(m, "kv_cache_dtype")]:
        number, at = re.search(r"(?:^|\\.)(\\d+)(?:\\.|$)", name), types.SimpleNamespace(layer=layer@GROUP@)
@ROOTS@
        row = {"name": name, "index": number and int(number[1]), "role": @ROLE@}
        layers.append(row | {field: @AS_RECORDED@(first(at, paths)) for field, paths, *_ in @TABLES@ if paths})
    return layers"""

PLAIN = ('    plain = lambda v: getattr(v, "_name_", None) or str(v).removeprefix("torch.")'
         '  # noqa: E731 - as the record')
# The objects a layer's reading loop needs first, each only where CHECKS (or RATIOS) read it.
SETUP = {
    "held": '    held = {n: g.kv_cache_spec for g in first(runner, PATHS["kv_cache_config"]).kv_cache_groups '
            'for n in g.layer_names}',
    "groups": '    groups = first(runner, PATHS["kv_cache_config"]).kv_cache_groups',
    "draft": '    draft = first(runner, PATHS["draft"]) or ()  # the drafter\'s own layers',
    "builders": '    builders = {n: a.metadata_builders[0] for s in first(runner, PATHS["attn_groups"]) for a in s\n'
                '                for n in a.layer_names}  # each layer\'s first metadata builder',
}
# The roots a layer's paths start at, beyond the module itself (`layer`).
ROOTS = {
    "group": '        at.spec = (getattr(at.group, "kv_cache_specs", None) or {}).get(name, at.group)'
             '  # its own in its group',
    "group_id": '        at.group_id = next((i for i, g in enumerate(groups) if name in g.layer_names), None)',
    "builder": '        at.builder = builders.get(name)',
    "backend": '        at.backend = layer.@CALL@().get_name()',
}

# The model folder of a state script: no tokens are read, so the weights are vLLM's dummy ones, or, where a check
# reads the checkpoint's scalars (its KV scales), random ones transformers draws with those scalars added.
CONFIG_ONLY = """\
pathlib.Path(model := tempfile.mkdtemp(), "config.json").write_text(json.dumps(CONFIG))  # vLLM draws the weights"""
WITH_DRAFT = """\
for folder, config in ((model := tempfile.mkdtemp(), CONFIG), (draft := tempfile.mkdtemp(), DRAFT_CONFIG)):
    pathlib.Path(folder, "config.json").write_text(json.dumps(config))  # config.json alone: vLLM draws the weights
ENGINE_ARGS["speculative_config"]["model"] = draft"""
WITH_SCALARS = """\
arch = transformers.AutoConfig.for_model(**{k: v for k, v in CONFIG.items() if k != "quantization_config"})
hf, model = transformers.AutoModelForCausalLM.from_config(arch, dtype=torch.bfloat16), tempfile.mkdtemp()
scalars = {p.format(i): torch.tensor(v) for p, v, (first, end) in SCALARS for i in range(first, end)}  # its KV scales
hf.save_pretrained(model, state_dict=hf.state_dict() | scalars)
pathlib.Path(model, "config.json").write_text(json.dumps(CONFIG))  # the checkpoint's own, its quantization included"""

# The engine's state; an exception is no state to check (its traceback says where vLLM raised it), unless the case
# accepts a refusal at start: then it is caught and compared with the refusal's words.
READ = "state = vllm.LLM(model=model, **ENGINE_ARGS).collective_rpc(resolved)[0]"
READ_OR_REFUSED = """\
try:
    state, error = vllm.LLM(model=model, **ENGINE_ARGS).collective_rpc(resolved)[0], None
except Exception as err:  # noqa: BLE001 - a refusal is what this script may observe
    traceback.print_exc()
    state, error = [], f"{type(err).__name__}: {err}\""""

CHECK = """\
chosen = lambda key, op, values: [la for la in state if (la[key] in values) == (op == "in")]  # noqa: E731 - as judged
wrong = [f"no layer with {' '.join(map(str, select))}" for _, _, select, _ in CHECKS if not chosen(*select)]
wrong += [f"layer {la['name']}: {field} {la[field]!r}" for field, _, select, wanted in CHECKS  # each wanted a glob
          for la in chosen(*select) if not any(fnmatch.fnmatchcase(la[field], str(w)) for w in wanted)]"""

RATIOS = """\
pages = [[{la[field] for la in chosen(*side)} for side in (of, to)] for field, _, of, to, _ in RATIOS]
wrong += [f"page sizes {p} / {q}, not {row[-1]}:1" for (p, q), row in zip(pages, RATIOS)  # each side's one page size
          if not all(len(s) == 1 and "None" not in s for s in (p, q)) or abs(int(*p) / int(*q) - row[-1]) > 1e-9]"""

ASSERT = """\
assert not wrong, f"expected {EXPECTED}; observed: {wrong}"
print("OK:", EXPECTED)"""
ASSERT_OR_REFUSED = """\
assert refused or (not wrong and not REFUSAL_REQUIRED), f"expected {EXPECTED}; observed: {error or wrong}"
print("OK:", EXPECTED)"""


def selector(select: str | list[int], skipped: list[str]) -> list[Any]:
    """A rule's selector as the script tests it, [row key, "in" or "not in", values]: layer indices (as the record
    numbers them), indices left out, or a role. The judge counts a layer skipped when its number is one of the skip
    list's entries."""
    if isinstance(select, list):
        return ["index", "in", select]
    numbers = [int(s) for s in skipped if s.isdigit()]
    words: dict[str, list[Any]] = {
        "all": ["index", "not in", []], "target": ["role", "in", ["target"]], "draft": ["role", "in", ["draft"]],
        "skipped": ["index", "in", numbers], "not_skipped": ["index", "not in", numbers]}
    return words[select]


def paths(version: str | None, keys: set[str]) -> dict[str, list[str]]:
    """The attribute paths the probe reads, for this vLLM (harness/vllm_compat/engine.py), as data."""
    table: dict[str, Sequence[tuple[str, Sequence[str]]]] = {
        "runner": vllm_compat.MODEL_RUNNER_PATHS, "kv_cache_config": vllm_compat.KV_CACHE_CONFIG_PATHS,
        "attn_groups": vllm_compat.ATTN_GROUPS_PATHS, "layers": vllm_compat.FORWARD_CONTEXT_PATHS,
        "draft": vllm_compat.DRAFT_LAYER_NAME_PATHS}  # short ones first: the script's data packs them on a line
    return {key: [p for alternatives in vllm_compat.for_version(rows, version) for p in alternatives]
            for key, rows in table.items() if key in keys}


def layer_reads(version: str | None) -> dict[str, list[str]]:
    """Where the script reads each field a layers rule may name, for this vLLM (the scales where the record reads
    them: harness/vllm_compat LAYER_SCALE_ATTRS, the first attribute set)."""
    scales = vllm_compat.for_version(vllm_compat.LAYER_SCALE_ATTRS, version)[0]
    return LAYER_PATHS | {field: [f"layer.{a}" for a in attrs] for field, attrs in scales.items()}


def _read_at(kind: str, field: str, version: str | None) -> tuple[str, list[str]]:
    """(the row's key, the paths the value is read at) of one field a layers / groups / builders rule names."""
    if kind == "groups":
        return f"group {field}", ["group.__class__.__name__" if field == "spec_type" else f"group.{field}"]
    if kind == "builders":
        return f"builder {field}", [f"builder.{field}"]
    if field in ROW_FIELDS:
        return field, []
    reads = layer_reads(version)
    if field not in reads:
        raise ReproError(f"a layers rule on {field!r}: a minimal script does not read it; use --full")
    return field, reads[field]


def data(checks: list[dict[str, Any]], skipped: list[str], version: str | None, has_draft: bool) -> dict[str, Any]:
    """The state text's data: CHECKS (a row per value a layers / groups / builders rule wants: its key in a layer's
    row, where it is read, the layers selected, the values wanted), RATIOS (page-size rules), the attribute paths
    (only those the checks need)."""
    rows = [[*_read_at(c["rule"], field, version), selector(c["select"], skipped), wanted]
            for c in checks if c["rule"] != "page_size_ratio" for field, wanted in c["wanted"].items()]
    ratios = [["page_size_bytes", LAYER_PATHS["page_size_bytes"], selector(c["select"], skipped),
               selector(c["to"], skipped), c["equals"]] for c in checks if c["rule"] == "page_size_ratio"]
    roots = {path.split(".")[0] for row in rows + ratios for path in row[1]}
    keys = {"runner", "layers", *(["kv_cache_config"] if roots & set(GROUP_ROOTS) else []),
            *(["draft"] if has_draft else []), *(["attn_groups"] if "builder" in roots else [])}
    out: dict[str, Any] = {"CHECKS": rows, "RATIOS": ratios, "PATHS": paths(version, keys)}
    return {k: v for k, v in out.items() if v or k in ("CHECKS", "PATHS")}


def functions(state_data: dict[str, Any], version: str | None) -> list[str]:
    """`resolved`, setting for each layer only the roots CHECKS read (and its page where RATIOS compare pages)."""
    roots = {path.split(".")[0] for row in state_data["CHECKS"] + state_data.get("RATIOS", []) for path in row[1]}
    keys = state_data["PATHS"]
    wanted = [root for root in ("group", "group_id", "builder", "backend")
              if root in roots or (root == "group" and "spec" in roots)]
    setup = [SETUP["held"]] * ("group" in wanted) + [SETUP["groups"]] * ("group_id" in wanted) + [
        SETUP["draft"]] * ("draft" in keys) + [SETUP["builders"]] * ("builder" in roots)
    call = vllm_compat.for_version(vllm_compat.LAYER_BACKEND_CALLS, version)[0][0]
    tables = "CHECKS + RATIOS" if "RATIOS" in state_data else "CHECKS"
    role = '"draft" if name in draft else "target"' if "draft" in keys else '"target"'
    group = ", group=held.get(name)" * ("group" in wanted)  # its group's spec
    # A dtype or an enum is written as the record writes it; a layer's own values (strings, numbers) need no more.
    dtypes = bool(roots - {"layer", "group_id", "backend"})
    text = RESOLVED.replace("@AS_RECORDED@", "plain" if dtypes else "str")
    lines = text.replace("@ROLE@", role).replace("@TABLES@", tables).replace("@GROUP@", group).split("\n")
    parts = {"@SETUP@": setup, "@ROOTS@": [ROOTS[r] for r in wanted], "@PLAIN@": [PLAIN] * dtypes}
    lines = [out for line in lines for out in parts.get(line, [line])]
    return ["\n".join(lines).replace("@CALL@", call)]


def imports(spec: dict[str, Any]) -> list[str]:
    """The modules a state script uses (transformers and torch are imported after vLLM)."""
    return ["fnmatch", "functools", "json", "os", "pathlib", "re", "tempfile", "types",
            *(["traceback"] if spec["refusals"] else [])]


def model_text(spec: dict[str, Any]) -> str | None:
    """The statements that write the model folder(s); None where the script writes weights a state check does not
    read (script.py writes those)."""
    draft = (spec["engine_args"].get("speculative_config") or {}).get("model")
    if not spec["weights"]:
        return WITH_DRAFT if spec.get("draft") and draft not in (None, "@MODEL@") else (
            CONFIG_ONLY if draft is None else None)
    return WITH_SCALARS if spec["model"].get("scalars") and draft is None else None


def main_text(state_data: dict[str, Any], refused: list[str]) -> str:
    """The engine's state read, then every row of CHECKS (and RATIOS) checked, the assert."""
    return "\n".join([READ_OR_REFUSED if refused else READ, *refused, CHECK,
                      *([RATIOS] if "RATIOS" in state_data else []), ASSERT_OR_REFUSED if refused else ASSERT])
