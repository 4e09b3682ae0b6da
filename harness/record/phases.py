"""Where a cell's time went, from its record's timings: the cell process's phases (import, engine start,
generation, teardown) with the engine start broken into the parts vLLM's log timed (model load, torch.compile,
CUDA-graph capture, the rest of the engine core: profiling, KV-cache allocation, kernel warm-up and autotuning), and
what is left of the runner's wall time (the process or worker start, waiting for a model build, the engine's own
shutdown as the cell process drops it, the GPU-memory check). Parts that are differences of two timings are derived
here, never stored, so a record keeps only what was measured."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# The breakdown's parts, in the order a cell spends them; each cell's parts sum to its total_s (where a part is
# unknown its time stays in the part that contains it: `engine_other` holds the whole engine start of a log that
# timed nothing, `start` whatever no phase timed).
PARTS = ("start", "import", "engine_setup", "model_load", "compile", "graph_capture", "engine_other", "probe",
         "generate", "teardown")
PART_TITLES = {
    "start": "process or worker start, model builds, vLLM's own engine shutdown, runner (total − phases)",
    "import": "import torch and vLLM",
    "engine_setup": "engine setup before the model (config, model inspection, distributed init)",
    "model_load": "model load (construction, weights)",
    "compile": "torch.compile (Dynamo, Inductor or its cache)",
    "graph_capture": "CUDA-graph capture",
    "engine_other": "rest of the engine start (profile run, KV-cache allocation, kernel warm-up, FlashInfer JIT; "
                    "all of it where the log timed nothing)",
    "probe": "probe of the resolved state",
    "generate": "generation (with references and accuracy)",
    "teardown": "engine teardown (warm worker)",
}
# Parts some cells have and others do not, shown as "of which" lines.
DETAILS = ("flashinfer_jit_s", "inductor_s", "dynamo_s", "jit_warmup_s", "weights_s", "cpu_s")


def breakdown(timings: Mapping[str, float] | None) -> dict[str, float]:
    """One record's timings as PARTS (seconds, each ≥ 0); empty for a record without total_s (a skip)."""
    t = {k: float(v) for k, v in (timings or {}).items() if isinstance(v, (int, float))}
    if "total_s" not in t:
        return {}
    init = t.get("init_s", 0.0)
    core = min(t.get("engine_core_s", 0.0), init)
    load = min(t.get("model_load_s", 0.0), init - core)
    compile_s = min(t.get("compile_s", 0.0), core)
    capture = min(t.get("graph_capture_s", 0.0), core - compile_s)
    parts = {
        "import": t.get("import_s", 0.0),
        "engine_setup": init - core - load if core else 0.0,
        "model_load": load,
        "compile": compile_s,
        "graph_capture": capture,
        "engine_other": core - compile_s - capture if core else init - load,
        "probe": t.get("probe_s", 0.0),
        "generate": t.get("generate_s", 0.0) + t.get("references_s", 0.0) + t.get("accuracy_s", 0.0),
        "teardown": t.get("teardown_s", 0.0),
    }
    parts["start"] = max(0.0, t["total_s"] - sum(parts.values()))
    return {part: round(max(0.0, parts[part]), 3) for part in PARTS}


def summed(timings: Iterable[Mapping[str, float] | None]) -> tuple[dict[str, float], dict[str, float], int]:
    """(PARTS summed over the records that ran, DETAILS summed where recorded, how many records ran)."""
    parts = dict.fromkeys(PARTS, 0.0)
    details = dict.fromkeys(DETAILS, 0.0)
    ran = 0
    for one in timings:
        cell = breakdown(one)
        if not cell:
            continue
        ran += 1
        for part, seconds in cell.items():
            parts[part] += seconds
        for detail in DETAILS:
            details[detail] += float((one or {}).get(detail) or 0.0)
    return parts, details, ran
