"""What a cell record holds: `CellRecord`, the one typed definition of the JSON object kept per cell (and of the
partial result the cell process writes on the way), with a TypedDict for every part that cases, judging and
reports read: layers, KV-cache groups, attention groups and their builders, timings, accuracy, the crash. A
TypedDict is a plain dict, so records are read and written as before and their JSON is unchanged. `check_record`
validates one (pydantic) where records are made and where they are read, and a malformed record raises
RecordError naming the file (or what made it) and the field. Every part is open (total=False, other keys
allowed): older records, a newer harness's fields and vLLM's own attribute names pass, while each field named
here must have its type. Records of old releases carry older names too (vllm_compat.normalize_record).
"""

from __future__ import annotations

import time
from typing import Any, Literal, get_args

from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict, Unpack

from matrix.schema import validation_problems

Verdict = Literal["pass", "fail", "xfail", "error", "skip"]
# ok / crash: the cell process's own; timeout / killed / error: the runner's (harness/judge/outcome.py).
Status = Literal["ok", "crash", "timeout", "killed", "error", "skipped"]
Mode = Literal["full", "probe"]  # probe: `kvmatrix run --probe-only`; records from before the modes ran in full

VERDICTS: tuple[str, ...] = get_args(Verdict)
_open = with_config(ConfigDict(extra="allow"))


@_open
class Axes(TypedDict, total=False):
    """The cell's place on the case's matrix (matrix/axes.py AXES)."""

    kv_cache_dtype: str
    kv_cache_dtype_skip_layers: list[str]
    speculative: str | None
    attention_backend: str | None


# --- what the worker resolved (harness/cell/probe.py) ------------------------------------------------------


@_open
class Layer(TypedDict, total=False):
    """One attention layer: what `layers:` expectations select and check (matrix/expectations.py LAYER_FIELDS)."""

    name: str
    index: int | None
    role: Literal["target", "draft"]
    kv_cache_dtype: str | None
    backend: str | None
    spec_dtype: str | None
    page_size_bytes: int | None
    group: int | None
    k_scale: float | None
    v_scale: float | None


@_open
class KvGroup(TypedDict, total=False):
    """One KV-cache group and its spec (vllm_compat.KV_SPEC_FIELDS): what `groups:` expectations check."""

    group: int
    layer_names: list[str]
    spec_type: str | None
    dtype: str | None
    block_size: int | None
    page_size_bytes: int | None
    kv_quant_mode: str | None
    cache_dtype_str: str | None


# An attention metadata builder's dtypes: the named ones (vllm_compat.BUILDER_DTYPE_ATTRS, with the current names
# of renamed ones, vllm_compat.QUERY_DTYPE_FIELDS) and any other attribute holding a dtype. `class` is a keyword.
Builder = _open(TypedDict("Builder", {
    "class": str,
    "q_data_type_prefill": str | None,
    "q_data_type_decode": str | None,
    "q_data_type": str | None,
    "cache_dtype": str | None,
    "kv_cache_dtype": str | None,
}, total=False))


@_open
class AttnGroup(TypedDict, total=False):
    """One attention group of the model runner and its first metadata builder: what `builders:` checks."""

    group: int
    subgroup: int
    backend: str | None
    layer_names: list[str]
    builder: Builder | None


# --- what the cell process and the runner observed ---------------------------------------------------------


@_open
class ExceptionInfo(TypedDict, total=False):
    """The exception a phase of the cell process raised (harness/cell/main.py describe)."""

    type: str
    message: str
    traceback_tail: str


@_open
class Timings(TypedDict, total=False):
    """Seconds per phase of the cell process, and the whole cell as the runner timed it."""

    import_s: float
    init_s: float
    probe_s: float
    generate_s: float
    accuracy_s: float
    total_s: float


@_open
class Emulation(TypedDict, total=False):
    """What the cell patched to take another class's decisions: a CUDA capability or a CPU level."""

    capability: list[int]
    patched_classes: list[str]
    cpu_isa: str
    patched_probes: list[str]


@_open
class AccuracyResult(TypedDict, total=False):
    """lm-eval's score of the cell's engine, per sample in doc order (harness/cell/lm_eval_engine.py)."""

    task: str
    metric: str
    score: float
    n: int
    doc_ids: list[int]
    samples: list[float]
    tokens: list[list[int]]


@_open
class Crash(TypedDict, total=False):
    """The parts a crash fingerprint hashes (harness/judge/fingerprint.py Crash)."""

    type: str
    message: str
    site: str | None
    phase: str | None


@_open
class GpuMemoryCheck(TypedDict, total=False):
    """The cell's GPU after it ended, against the run's baseline (harness/run/gpu_check.py)."""

    gpu_index: int
    baseline_mib: float
    after_mib: float
    leaked_mib: float
    leaked_pids: dict[str, float]
    exclusive: bool
    waited_s: float


# --- what judging added (harness/judge/) -------------------------------------------------------------------


@_open
class RuleResult(TypedDict, total=False):
    """One applicable expectation's check."""

    rule: str
    ok: bool
    detail: str


@_open
class AccuracyComparison(TypedDict, total=False):
    """The cell's accuracy paired with its baseline cell's (harness/judge/accuracy.py), or why it is not."""

    baseline: str
    missing: str
    n: int
    baseline_score: float
    score: float
    delta: float
    interval: list[float]
    confidence: float
    significant: bool
    mcnemar_p: float
    sequences: int
    identical_fraction: float
    first_divergence: int | None


@_open
class Waived(TypedDict, total=False):
    """The verdict a waiver turned into `xfail`, and the waiver (harness/judge/waivers.py)."""

    verdict: Verdict
    waiver: str
    link: str


@_open
class CellRecord(TypedDict, total=False):
    """One cell on one GPU class: the runner's identity fields, what the cell process recorded, the outcome and
    the judgement. `cell_id` and (once judged) `verdict` are always there (harness/records.py)."""

    # the task (harness/run/cell_run.py)
    cell_id: str
    case: str
    model: str
    axes: Axes
    gpu_class: str
    emulated_from: str | None
    run_id: str
    gpu_index: str | None
    mode: Mode
    mode_note: str
    engine_args: dict[str, Any]
    # the cell process (harness/cell/main.py)
    vllm_version: str | None
    vllm_commit: str | None
    torch_version: str | None
    python: str
    status: Status
    phase: str
    exception: ExceptionInfo | None
    timings: Timings
    emulation: Emulation | None
    worker_cache_dtype: str | None
    tokens: list[list[int]]
    texts: list[str]
    layers: list[Layer]
    kv_groups: list[KvGroup]
    attn_groups: list[AttnGroup]
    probe_error: str | None
    accuracy: AccuracyResult
    # the outcome (harness/judge/outcome.py, fingerprint.py; harness/run/gpu_check.py)
    log: str
    error_tail: str
    signal: str
    signature: str | None
    fingerprint: str
    crash: Crash
    gpu_memory: GpuMemoryCheck
    leak: str
    # the judgement (harness/judge/judge.py)
    verdict: Verdict
    reason: str
    expectations: list[RuleResult]
    tags: list[str]
    accuracy_vs_baseline: AccuracyComparison
    not_emulable: bool
    flaky: bool
    first_failure: str
    waived: Waived
    finished_at: str


_ADAPTER = TypeAdapter(CellRecord)


class RecordError(ValueError):
    """A record that does not fit CellRecord: where it is (a file, or what made it) and every wrong field."""

    def __init__(self, where: str, problems: list[tuple[str, str]]):
        self.where, self.problems = where, problems
        self.field = problems[0][0]
        super().__init__(f"{where}: not a cell record: " + "; ".join(f"field '{f}': {m}" for f, m in problems))


def check_record(record: CellRecord, where: str) -> CellRecord:
    """The record itself, once it fits CellRecord; else RecordError naming `where` and the fields."""
    try:
        _ADAPTER.validate_python(record)
    except ValidationError as err:
        raise RecordError(where, validation_problems(err)) from None
    return record


def new_record(**fields: Unpack[CellRecord]) -> CellRecord:
    """A record begun by hand (the runner's task records, the pools' and the CLI's records of cells that did not
    run, the cell process's result): these fields, checked."""
    return check_record(CellRecord(**fields), f"the record made for {fields.get('cell_id')!r}")


def finished_now() -> str:
    """The time as a record's `finished_at` says it: UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
