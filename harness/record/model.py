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
from collections.abc import Mapping
from typing import Any, cast

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict, Unpack

from kvmatrix.harness.record.parts import (  # noqa: F401  (the parts are part of this module's interface)
    VERDICTS,
    AccuracyComparison,
    AccuracyResult,
    AttnGroup,
    Axes,
    Builder,
    Crash,
    DifferentialComparison,
    Emulation,
    ExceptionInfo,
    GpuMemoryCheck,
    KvGroup,
    Layer,
    Mode,
    RankState,
    Reference,
    RuleResult,
    Runtime,
    Status,
    Timings,
    TokenComparison,
    Verdict,
    Waived,
    WarmAttempt,
    WorkerInfo,
    WorkloadRun,
    open_to_other_keys,
)
from kvmatrix.matrix.schema import validation_problems


@open_to_other_keys
class CellRecord(TypedDict, total=False):
    """One cell on one GPU class: the runner's identity fields, what the cell process recorded, the outcome and
    the judgement. `cell_id` and (once judged) `verdict` are always there (harness/record/files.py)."""

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
    logprobs: list[list[dict[str, float]]]  # cells of a differential pair: per position, {token id: logprob}
    runtime: Runtime
    workload_run: WorkloadRun
    references: dict[str, Reference]  # an oracle's plain generation of its cells' workload prompts
    layers: list[Layer]
    kv_groups: list[KvGroup]
    attn_groups: list[AttnGroup]
    ranks: list[RankState]  # a cell that spans several GPUs: every rank's resolved state
    backend_notes: list[str]  # vLLM's log lines saying it replaced a forced attention backend
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
    # which isolation ran the cell (harness/run/launch.py): "worker" or "process"
    isolation: str
    fresh_first: str  # why a warm run went straight to a fresh process for this cell (a known failure)
    confirmed_by: str  # the cell whose fresh process showed this expected failure first (harness/run/confirmations.py)
    worker: WorkerInfo
    warm_attempt: WarmAttempt
    # the judgement (harness/judge/judge.py)
    verdict: Verdict
    reason: str
    expectations: list[RuleResult]
    tags: list[str]
    accuracy_vs_baseline: AccuracyComparison
    differential: DifferentialComparison
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


def check_record(record: Mapping[str, Any], where: str) -> CellRecord:
    """The record itself (not pydantic's copy: its JSON stays as it was), once it fits CellRecord; else
    RecordError naming `where` and the fields."""
    try:
        _ADAPTER.validate_python(record)
    except ValidationError as err:
        raise RecordError(where, validation_problems(err)) from None
    return cast(CellRecord, record)  # just validated


def new_record(**fields: Unpack[CellRecord]) -> CellRecord:
    """A record begun by hand (the runner's task records, the pools' and the CLI's records of cells that did not
    run, the cell process's result): these fields, checked."""
    return check_record(CellRecord(**fields), f"the record made for {fields.get('cell_id')!r}")


def finished_now() -> str:
    """The time as a record's `finished_at` says it: UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
