"""From a cell on a GPU class to a standalone Python script that reproduces it with vLLM and torch alone:
the cell's tiny checkpoint (its small files verbatim, its weights regenerated from the builder's seed), the
cell's exact engine arguments and environment, a minimal resolved-state probe, a greedy generation, and one
`assert` on what the case expects of the cell."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pprint
from pathlib import Path
from typing import Any

from kvmatrix.harness import vllm_compat
from kvmatrix.harness.cell import workloads
from kvmatrix.harness.judge import tokens
from kvmatrix.harness.models import checkpoint
from kvmatrix.harness.models.trained import BUILDERS as TRAINED_BUILDERS
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.repro import standalone
from kvmatrix.harness.run.model_builds import build_models, models_needed
from kvmatrix.harness.run.task.spec import engine_args_for
from kvmatrix.matrix.conditions import is_range, when_matches
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.expectations import CrashExpected, RecordCheck
from kvmatrix.matrix.schema import X86_CPU_LEVELS, GpuClass, ModelEntry

HERE_MARK = "@HERE@"  # the script's own folder, replaced when it runs
PROBED_FIELDS = ("kv_cache_dtype", "spec_dtype", "page_size_bytes", "role")  # what the script's probe reads
SEEDS_TRIED = range(4)  # builders draw a model's tensors from seed 0, its drafts from 1 and 2


class ReproError(Exception):
    pass


class NeedsFullScript(ReproError):
    """A cell a minimal script cannot show (weights it cannot draw: a DFlash draft's, FP8 ones): the full script,
    its exact checkpoint written out, can."""


def model_spec(folder: Path) -> dict[str, Any]:
    """A built checkpoint as the script rebuilds it: small files verbatim; weights as (seed, shapes) when the
    builder's `weights(shapes, seed)` reproduces every large tensor bit for bit (after `per_channel_fp8` for the
    FP8 weights of a quantized checkpoint, each stored beside its `weight_scale`), small others as values."""
    files = {p.name: p.read_text() for p in sorted(folder.iterdir()) if p.suffix != ".safetensors"}
    path = folder / "model.safetensors"
    if not path.exists():
        return {"files": files, "shapes": None}
    import torch
    from safetensors.torch import load_file

    stored = load_file(str(path))
    fp8 = sorted(name for name, t in stored.items()
                 if t.dtype == torch.float8_e4m3fn and name.removesuffix("weight") + "weight_scale" in stored)
    derived = {name.removesuffix("weight") + "weight_scale" for name in fp8}  # per_channel_fp8 writes them
    shapes = {name: list(t.shape) for name, t in stored.items() if t.ndim > 0 and name not in derived}
    for seed in SEEDS_TRIED:
        drawn = checkpoint.per_channel_fp8(checkpoint.weights({k: tuple(v) for k, v in shapes.items()}, seed), fp8)
        same = {name for name, t in drawn.items() if _bit_equal(t, stored[name])}
        rest = set(stored) - same
        if all(stored[name].numel() <= 64 for name in rest) and derived <= same:
            extra = {name: [str(stored[name].dtype).removeprefix("torch."), list(stored[name].shape),
                            stored[name].flatten().tolist()] for name in sorted(rest)}
            return {"files": files, "seed": seed, "shapes": {k: shapes[k] for k in sorted(same - derived)},
                    "fp8_per_channel": fp8, "extra": extra}
    raise ReproError(f"{folder.name}: its weights are not drawn by the tiny builders (a trained model?); "
                     "a standalone script cannot regenerate them")


def _bit_equal(a, b) -> bool:
    """Same dtype, shape and bytes (torch compares no float8 tensors by value)."""
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                     b.reshape(-1).view(torch.uint8))


def _signature_patterns(names: list[str], version: str | None) -> list[str]:
    """The patterns of these signatures, a family's standing for its members'."""
    return [p for name, versions, patterns in vllm_compat.SIGNATURES
            if any(vllm_compat.signature_matches(n, name) for n in names)
            and vllm_compat.version_matches(version, versions) for p in patterns]


def _layer_rule(check: RecordCheck, out: dict[str, Any]) -> None:
    """A layers check into `out`: the probed fields the script can compare exactly, the rest not encoded."""
    wanted = {k: v for k, v in check.wanted().items() if k in PROBED_FIELDS}
    if any(is_range(v) or (isinstance(v, str) and set("*?[") & set(v)) for v in wanted.values()):
        out["not_encoded"].append(f"layers {check.wanted()} (ranges / globs)")
        wanted = {}
    if set(check.wanted()) - set(wanted):
        out["not_encoded"].append(f"layers fields {sorted(set(check.wanted()) - set(wanted))}")
    if wanted:
        out["layers"].append({"select": check.select, "wanted": wanted})


def expectations(cell: Cell, context: dict, version: str | None) -> dict[str, Any]:
    """The applicable rules, in the forms the script checks; the others listed as not encoded."""
    out: dict[str, Any] = {"refuse": None, "layers": [], "page_size_ratios": [], "not_encoded": []}
    for rule in cell.case.expect:
        if not when_matches(rule.when, context):
            continue
        if rule.refuse is not None:
            names = rule.refuse.names
            out["refuse"] = {"signatures": names, "optional": rule.refuse.optional,
                             "patterns": _signature_patterns(names, version)}
        if isinstance(rule.crash, CrashExpected):
            out["not_encoded"].append(f"known crash {rule.crash.signature} (the script asserts a clean run)")
        if rule.layers is not None:
            _layer_rule(rule.layers, out)
        if rule.page_size_ratio is not None:
            out["page_size_ratios"].append(rule.page_size_ratio.model_dump())
        for kind in ("groups", "builders"):
            if getattr(rule, kind) is not None:
                out["not_encoded"].append(f"{kind} check {getattr(rule, kind).wanted()}")
    return out


def emulation(gpu: GpuClass) -> dict[str, Any]:
    """What the script patches so that vLLM takes `gpu`'s decisions on another machine of the same kind."""
    out: dict[str, Any] = {}
    if gpu.device == "cuda" and gpu.compute_capability:
        out["compute_capability"] = [int(x) for x in str(gpu.compute_capability).split(".")]
    if gpu.device == "cpu" and gpu.cpu_isa in X86_CPU_LEVELS:
        probes = vllm_compat.for_version(vllm_compat.CPU_ISA_PROBES, None)[0]
        higher = X86_CPU_LEVELS[X86_CPU_LEVELS.index(gpu.cpu_isa) + 1:]
        out["cpu_isa_probes_off"] = [name for level in higher for name in probes[level]]
    return out


def script_spec(task: Task, models: dict[str, ModelEntry], cache_dir: Path, use_hub: bool,
                version: str | None) -> dict[str, Any]:
    cell, gpu = task.cell, task.gpu
    trained = [n for n in models_needed(cell) if models[n].tiny in TRAINED_BUILDERS]
    if trained and not use_hub:
        raise ReproError(f"{cell.cell_id}: {trained[0]} is trained, not drawn from a seed; a standalone script "
                         "cannot regenerate its weights")
    built = {} if use_hub else build_models([task], models, cache_dir)
    names = [n for n in models_needed(cell) if n in built]
    local = {name: Path(f"{HERE_MARK}/{name}") for name in names}
    try:
        args = engine_args_for(cell, gpu, models, local, use_hub, vllm_version=version)
    except KeyError as err:
        raise ReproError(f"{cell.cell_id}: {err.args[0]} (trained or hub-only models: try --hub)") from err
    draft = cell.axes["speculative"]
    offset = checkpoint.LAYERS if draft and models[draft].draft else None
    context = cell.context(task.gpu_name, gpu, version, emulated=False)
    expect = expectations(cell, context, version)
    return {
        "cell_id": cell.cell_id, "gpu_class": task.gpu_name, "engine_args": args,
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **cell.case.env},
        "emulate": emulation(gpu), "models": {name: model_spec(built[name]) for name in names},
        "prompts": list(cell.case.generate.prompts), "max_tokens": cell.case.generate.max_tokens,
        "skip_layers": [str(s) for s in cell.axes["kv_cache_dtype_skip_layers"] or []],
        "draft_layer_offset": offset, "expect": expect,
        "oracle": oracle_spec(task, models, local, use_hub, version, context, expect),
    }


def oracle_spec(task: Task, models: dict[str, ModelEntry], local: dict[str, Path], use_hub: bool,
                version: str | None, context: dict, expect: dict[str, Any]) -> dict[str, Any] | None:
    """A differential cell's oracle (harness/judge/differential.py) as the script's second run: the same
    configuration eager and plain, its greedy tokens compared with the cell's by the harness's own rule (exactly
    where the case says `tokens: exact`, else closely: the case's logprob and tie tolerances). Workload cells: not
    encoded (their prompts are kvmatrix's)."""
    cell = task.cell
    oracle_id = cell.oracle_on(task.gpu_name)
    if oracle_id is None or cell.case.differential is False:
        return None
    if cell.axes["workload"] != "plain":
        expect["not_encoded"].append(f"differential against {oracle_id}: workload {cell.axes['workload']}")
        return None
    oracle = cell.case.differential.oracle
    twin = dataclasses.replace(cell, axes={**cell.axes, "execution": oracle.execution, "workload": oracle.workload})
    rules = [r for r in cell.case.expect if r.tokens is not None and when_matches(r.when, context)]
    return {"cell_id": oracle_id, "mode": f"{oracle.execution}/{oracle.workload}",
            "engine_args": engine_args_for(twin, task.gpu, models, local, use_hub, vllm_version=version),
            "tokens_exact": bool(rules) and rules[-1].tokens == "exact",
            "top_logprobs": cell.case.differential.top_logprobs,
            "logprob_tolerance": cell.case.differential.logprob_tolerance,
            "tie_tolerance": cell.case.differential.tie_tolerance}


def _body() -> str:
    source = inspect.getsource(standalone)
    return source[source.index("import enum"):]


def _verbatim(*functions: Any) -> list[str]:
    """Each function's source, as the script's own, a blank line after each."""
    return [text for function in functions for text in (inspect.getsource(function), "")]


def literal_spec(spec: dict[str, Any]) -> str:
    """The spec as a literal that reads back as itself (a text from a case never becomes code)."""
    text = pprint.pformat(spec, width=116, sort_dicts=False)
    if ast.literal_eval(text) != spec:
        raise ReproError("the script's spec does not read back as itself")
    return text


def literal(text: str) -> str:
    return repr(str(text))


def render(spec: dict[str, Any], command: str) -> str:
    """The script's text: header, SPEC, the builder's weights function, the runtime, the call."""
    return "\n".join([
        "#!/usr/bin/env python3",
        '"""Reproduces a kvmatrix cell (SPEC["cell_id"]) on a GPU class (SPEC["gpu_class"]) with vLLM and torch only.',
        "",
        "Generated by the command GENERATED_BY holds. Run it with the Python that has vLLM: it writes the tiny model",
        "next to itself, starts vllm.LLM with the cell's engine arguments, prints what vLLM resolved, and ends in one",
        'assert on what the case expects (exit status 0: it holds). Every value below is data."""',
        "",
        f"GENERATED_BY = {literal(command)}",
        f"SPEC = {literal_spec(spec)}",
        "",
        "",
        "# The tiny checkpoint builder's weight generator and FP8 quantizer, verbatim from kvmatrix's",
        "# harness/models/checkpoint.py",
        "import hashlib  # noqa: E402",
        "",
        "",
        *_verbatim(checkpoint.weights, checkpoint.per_channel_fp8),
        "# The logprobs a cell records and the differential rule that compares them with the oracle's, verbatim from",
        "# kvmatrix's harness/cell/workloads.py and harness/judge/differential.py",
        "from typing import Any  # noqa: E402",
        "",
        "",
        *_verbatim(workloads._logprobs, *tokens.SEQUENCE_RULE),
        "# The runtime, inlined from kvmatrix's harness/repro/standalone.py",
        _body(),
        "",
        'if __name__ == "__main__":',
        "    main(SPEC)",
        "",
    ])
