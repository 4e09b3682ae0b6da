"""What a cell record holds, phase by phase. The JSON object kept per cell grows as the cell goes through the
harness, and each phase is a TypedDict extending the one before it (a plain dict: records are read and written as
before and their JSON is unchanged):

- `CellOutput`: the task's identity, as the runner begins the record (harness/run/task/runner.py), and what the cell
  process recorded (harness/cell/main.py: its RESULT.json);
- `OutcomeRecord`: and what only the runner knows once the process ended: the final status, the signal, the
  failure's signature and fingerprint, the log, which isolation and worker ran it and how its process started,
  the GPU-memory check (harness/judge/outcome.py, fingerprint.py; harness/run/task/runner.py, launch.py,
  gpu_check.py);
- `JudgedRecord`: and the judgement, a `verdict` always among it (harness/judge/judge.py): what run folders hold
  (harness/record/files.py), the history stores and reports read.

Each phase is checked (pydantic) at its boundary by a function given where the record is (a file, or what made
it): `check_cell_output` as the cell process saves its result and as the runner reads it back
(files.read_result); `check_outcome` where the outcome joins the record, before judging (harness/run/task/runner.py
`finish`); `check_judged` as judging returns a record (judge.judge_record), where one is made without judging (a skip),
and as records are written to and read from run folders and the history. A wrong field raises RecordError naming
`where` and the field; so does a field of a later phase (a cell process's result carrying a `verdict`): a phase
holds only what has happened by then. A TypedDict for every part that cases, judging and reports read (layers,
KV-cache groups, attention groups and their builders, timings, accuracy, the crash) is in parts.py. Every part
is open (total=False, other keys allowed): older records, a newer harness's fields and vLLM's own attribute names
pass, while each field named here must have its type. Records of old releases carry older names too
(vllm_compat.normalized_record).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Generic, TypeVar, cast

from pydantic import TypeAdapter, ValidationError
from typing_extensions import Required, TypedDict

from kvmatrix.harness.record.judged_parts import (  # noqa: F401  (the parts are part of this module's interface)
    AccuracyComparison,
    DifferentialComparison,
    KnownFailureNote,
    RuleResult,
    SpecDecodeRun,
    SpeculativeComparison,
    TokenComparison,
    Waived,
)
from kvmatrix.harness.record.parts import (  # noqa: F401  (the parts are part of this module's interface)
    VERDICTS,
    AccuracyResult,
    AttnGroup,
    Axes,
    Builder,
    Crash,
    Emulation,
    ExceptionInfo,
    ForcedRun,
    GpuMemoryCheck,
    KvGroup,
    Layer,
    Mode,
    ProcessStartedBy,
    RankState,
    Reference,
    Runtime,
    Status,
    Timings,
    Verdict,
    WarmAttempt,
    WorkerInfo,
    WorkloadRun,
    open_to_other_keys,
)
from kvmatrix.matrix.schema import validation_problems


@open_to_other_keys
class CellOutput(TypedDict, total=False):
    """A cell up to the end of its process: the runner's identity fields, then what the cell process wrote."""

    # the task (harness/run/task/runner.py)
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
    status: Status  # the process's own ok / crash; the outcome sets the runner's (timeout, killed, error)
    phase: str
    exception: ExceptionInfo | None
    timings: Timings
    emulation: Emulation | None
    worker_cache_dtype: str | None
    weight_dtypes: list[str] | None  # the target model's parameters' dtypes (FP8 weights: float8_*), as loaded
    tokens: list[list[int]]
    texts: list[str]
    logprobs: list[list[dict[str, float]]]  # cells of a differential pair: per position, {token id: logprob}
    runtime: Runtime
    workload_run: WorkloadRun
    references: dict[str, Reference]  # an oracle's plain generation of its cells' workload prompts
    forced: ForcedRun  # a compared cell's teacher-forced decode of its oracle's tokens
    forced_reference: ForcedRun  # a cell's teacher-forced decode of its model reference's tokens
    noise_floor: ForcedRun  # an oracle's teacher-forced decode of its own tokens in another batch
    layers: list[Layer]
    kv_groups: list[KvGroup]
    attn_groups: list[AttnGroup]
    ranks: list[RankState]  # a cell that spans several GPUs: every rank's resolved state
    spec_decode: SpecDecodeRun  # a draft cell: what its generation drafted and accepted
    backend_notes: list[str]  # vLLM's log lines saying it replaced a forced attention backend
    probe_error: str | None
    accuracy: AccuracyResult


@open_to_other_keys
class OutcomeRecord(CellOutput, total=False):
    """A cell whose process has ended: its output and what happened to it, as the runner saw it."""

    # harness/judge/outcome.py, fingerprint.py; harness/run/process/gpu_check.py
    log: str
    error_tail: str
    signal: str
    signature: str | None
    fingerprint: str
    crash: Crash
    gpu_memory: GpuMemoryCheck
    leak: str
    # which isolation ran the cell (harness/run/process/launch.py): "worker" or "process"
    isolation: str
    worker: WorkerInfo
    # how the cell's process (or its worker's) started; absent in records made before templates
    process_start: ProcessStartedBy
    # how a warm run came to its record, set once the run's attempts are judged (harness/run/task/runner.py). They
    # are the runner's facts, not the judgement's: judging a stored record again redoes the judgement and keeps them.
    fresh_first: str  # why a warm run went straight to a fresh process for this cell (a known failure)
    # the cell whose fresh process showed this expected failure first (harness/run/task/confirmations.py)
    confirmed_by: str
    warm_attempt: WarmAttempt
    first_failure: str  # why this run's earlier attempt of the cell failed (a retry): judged `flaky` if it passes
    finished_at: str  # when the cell's last attempt ended (UTC, to the second)


@open_to_other_keys
class JudgedRecord(OutcomeRecord, total=False):
    """One cell on one GPU class, judged (harness/judge/judge.py): what a record file of a run folder holds."""

    verdict: Required[Verdict]
    reason: str
    expectations: list[RuleResult]
    tags: list[str]
    accuracy_vs_baseline: AccuracyComparison
    differential: DifferentialComparison
    speculative: SpeculativeComparison  # a draft cell against its no-draft and plain twins
    noise_floor_summary: dict[str, Any]  # an oracle's noise floor, summarized (harness/judge/differential.py)
    reference: dict[str, Any]  # the cell against its model's bf16 reference (harness/judge/reference.py)
    not_emulable: bool
    flaky: bool
    waived: Waived
    known_failure: KnownFailureNote
    # A record file a reader could not read (files.unreadable_record): why; such a record is never written.
    unreadable_record: str


def _fields(phase: Any) -> frozenset[str]:
    # Both sets: under postponed annotations Python cannot see `Required[...]` (pydantic can), and lists it optional.
    return phase.__required_keys__ | phase.__optional_keys__


# The fields each phase adds to the one before it.
_OUTCOME_FIELDS = _fields(OutcomeRecord) - _fields(CellOutput)
_JUDGEMENT_FIELDS = _fields(JudgedRecord) - _fields(OutcomeRecord)


def outcome_of(record: Mapping[str, Any]) -> OutcomeRecord:
    """A record less everything judging adds (a new dict, in the record's order): what judging it again starts
    from, so a record judged again is built whole, as when first judged, and keeps nothing of an earlier judgement.
    A record's fields of other harnesses (older, newer) are not judging's and stay."""
    return cast(OutcomeRecord, {key: value for key, value in record.items() if key not in _JUDGEMENT_FIELDS})


class RecordError(ValueError):
    """A record that does not fit its phase: where it is (a file, or what made it), the phase, every wrong field."""

    def __init__(self, where: str, phase: str, problems: list[tuple[str, str]]):
        self.where, self.problems = where, problems
        self.field = problems[0][0]
        super().__init__(f"{where}: not {phase}: " + "; ".join(f"field '{f}': {m}" for f, m in problems))


Phase = TypeVar("Phase")


class _Check(Generic[Phase]):
    """One phase's check: its fields' types, and none of the fields later phases add (`later`: each later phase's
    name and fields)."""

    def __init__(self, phase: type[Phase], name: str, later: Mapping[str, frozenset[str]]):
        self.adapter, self.name = TypeAdapter(phase), name
        self.later = {field: added_by for added_by, fields in later.items() for field in fields}

    def __call__(self, record: Mapping[str, Any], where: str) -> Phase:
        problems = [(field, f"belongs to {self.later[field]}, a later phase") for field in record
                    if field in self.later]
        try:
            self.adapter.validate_python(record)
        except ValidationError as err:
            problems = validation_problems(err) + problems
        if problems:
            raise RecordError(where, self.name, problems)
        return cast(Phase, record)  # the record itself, not pydantic's copy: its JSON stays as it was


_CELL_OUTPUT = _Check(CellOutput, "a cell's output", {"the outcome": _OUTCOME_FIELDS,
                                                      "the judgement": _JUDGEMENT_FIELDS})
_OUTCOME = _Check(OutcomeRecord, "an outcome record", {"the judgement": _JUDGEMENT_FIELDS})
_JUDGED = _Check(JudgedRecord, "a judged record", {})


def check_cell_output(record: Mapping[str, Any], where: str) -> CellOutput:
    """The record, once it fits CellOutput: as the cell process saves its result and the runner reads it."""
    return _CELL_OUTPUT(record, where)


def check_outcome(record: Mapping[str, Any], where: str) -> OutcomeRecord:
    """The record, once it fits OutcomeRecord: the outcome added, before judging."""
    return _OUTCOME(record, where)


def check_judged(record: Mapping[str, Any], where: str) -> JudgedRecord:
    """The record, once it fits JudgedRecord (a verdict among it): as judged, and as written and read back."""
    return _JUDGED(record, where)


def finished_now() -> str:
    """The time as a record's `finished_at` says it: UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
