"""The one judging path: an outcome record (fresh from a cell, or a stored record judged again) → its judged
record: the final verdict and reason, with the per-rule results. Used by both executors (this machine's and Ray's),
`kvmatrix run`, `rejudge` and `audit`, `qualify`, and the pytest front end, so every front end gives a record the
same verdict. Without side effects: the outcome, the records the cell is compared with (record/neighbours.py: read
by the caller, which knows the run folder) and the waivers go in, a new judged record comes out; no file is read
or written here and no input changes. One `Judgement` (verdict.py) goes through the stages, each returning the
next with its rule results and the record fields it adds.

In order: the case's expectations (verdict.py); accuracy against the baseline cell (accuracy.py); a workload that did
not take its runtime path, the comparison with the cell's oracle, and an oracle's own noise floor (differential.py), the
model's bf16 reference (reference.py); a draft cell's greedy outputs against its no-draft twin and its acceptance
against its plain twin (speculative.py); a failure emulation cannot reproduce is `skip`, a failure of the environment
(not vLLM) is `error`, a class's clear refusal of what its hardware cannot run is `skip`; a cell that failed and then
passed on a retry stays a (flaky) failure; a known failure (cases/_waivers.txt, waivers.py) is `xfail` with its link (a
waiver by finding wherever its finding shows), and so is a user's case failing as kvmatrix's own cases or waivers know
this vLLM fails (known_failures.py: what is known, and the date, are passed in, read by the caller). A stored record is
judged again from its outcome (record/types.py `outcome_of`): judging again is judging.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any, cast

from kvmatrix.harness.judge.accuracy import judge_accuracy
from kvmatrix.harness.judge.differential import judge_differential, judge_oracle_floor
from kvmatrix.harness.judge.execution import judge_workload
from kvmatrix.harness.judge.known_failures import NONE_KNOWN, KnownFailures, explain
from kvmatrix.harness.judge.reference import judge_reference
from kvmatrix.harness.judge.speculative import judge_speculative
from kvmatrix.harness.judge.verdict import Judgement, judge
from kvmatrix.harness.judge.waivers import Waiver, waive
from kvmatrix.harness.record.neighbours import Neighbours
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord, OutcomeRecord, check_judged, outcome_of
from kvmatrix.harness.vllm_compat import (
    ENVIRONMENT_SIGNATURES,
    NOT_EMULABLE_SIGNATURES,
    PLATFORM_REFUSALS,
    normalized_record,
)
from kvmatrix.harness.vllm_compat.declarations import UNQUANTIZED_KV_DTYPES
from kvmatrix.matrix.conditions import gpu_matches
from kvmatrix.matrix.expectations import Expectation


def judge_record(outcome: OutcomeRecord, task: Task, neighbours: Neighbours, waivers: Sequence[Waiver] = (),
                 today: datetime.date | None = None, known: KnownFailures = NONE_KNOWN) -> JudgedRecord:
    """The outcome record judged, as a new record (the outcome is left as it is): its final verdict and reason
    and the per-rule results, checked as a judged record. Its fields keep the outcome's order, those judging adds
    follow in the order of the stages. `neighbours`: the records the cell is compared with
    (record/neighbours.py). A stored record is judged again from its outcome (`outcome_of`: everything an earlier
    judgement added is dropped first), so judging it again is judging it. `today` decides which waivers have
    expired (the callers pass their run's date; default: the date now). `known`: what kvmatrix knows fails, for a
    user's case (known_failures.py `known_failures_for`, read by the caller: judging reads no file)."""
    record = normalized_record(outcome_of(outcome))
    context = task.context(record.get("vllm_version"))
    judgement = _compared(record, judge(record, rules_of(task), context), task, neighbours, context)
    judgement = _not_vllms_fault(record, judgement, task, context)
    judgement = _flaky(record, judgement)
    judged = cast(JudgedRecord, {**record, **judgement.fields, "expectations": judgement.results,
                                 "verdict": judgement.verdict, "reason": judgement.reason,
                                 "tags": list(task.cell.case.tags)})
    today = today or datetime.date.today()
    waived, _ = waive(judged, waivers, today)  # a "removable" waiver is reported over the whole run
    return check_judged(explain(waived, task, known, today),  # a user's case failing as kvmatrix knows vLLM fails
                        f"the judged record of {task.key}")


# What a model reference kvmatrix adds is held to: it starts and generates (harness/judge/reference.py checks that
# its cache resolved unquantized); the case's own rules describe the configurations the case lists.
ADDED_REFERENCE_RULES = [Expectation(crash=False)]


def rules_of(task: Task) -> list[Expectation]:
    """The rules a cell is judged by: its case's, or for a model reference the case does not list, starting and
    generating alone."""
    return ADDED_REFERENCE_RULES if task.cell.added_reference else task.cell.case.expect


def _compared(record: OutcomeRecord, judgement: Judgement, task: Task, neighbours: Neighbours,
              context: dict[str, Any]) -> Judgement:
    """The stages that compare the cell with what it is measured against: its accuracy baseline, its execution
    and workload, its differential oracle (and an oracle's own noise floor), its model reference, a draft's
    twins."""
    cell, gpu_name = task.cell, task.gpu_name
    if cell.baseline_id is not None:
        judgement = judge_accuracy(record, judgement, cell, neighbours.baseline, context)
    judgement = judge_workload(record, judgement, task.gpu.device)
    judgement = judge_differential(record, judgement, cell, neighbours.oracle, gpu_name, task.gpu.device, context)
    judgement = judge_oracle_floor(record, judgement, cell, gpu_name)
    judgement = judge_reference(record, judgement, cell, neighbours.reference, gpu_name, task.gpu.device)
    return judge_speculative(record, judgement, cell, neighbours, gpu_name, context)


def _not_vllms_fault(record: OutcomeRecord, judgement: Judgement, task: Task, context: dict[str, Any]
                     ) -> Judgement:
    """A failure emulation cannot reproduce is `skip` (marked `not_emulable`), one of the environment `error`, a
    class's clear refusal of what its hardware cannot run `skip`."""
    tail = record.get("error_tail")
    if task.emulated_from and record.get("signature") in NOT_EMULABLE_SIGNATURES:
        return judgement.then("skip", f"not emulable on {task.emulated_from}: {tail}", fields={"not_emulable": True})
    if record.get("signature") in ENVIRONMENT_SIGNATURES:
        return judgement.then("error", f"environment, not vLLM: {tail}")
    if judgement.verdict == "fail" and _refused_by_platform(record, context):
        return judgement.then("skip", f"{task.gpu_name} cannot run this, as vLLM says at start: {tail}")
    return judgement


def _flaky(record: OutcomeRecord, judgement: Judgement) -> Judgement:
    """A cell that failed (`first_failure`: this run's earlier attempt) and then passed stays a failure."""
    first = record.get("first_failure")
    if judgement.verdict != "pass" or first is None:
        return judgement
    return judgement.then("fail", f"flaky: failed first ({first}), then passed", fields={"flaky": True})


def _refused_by_platform(record: OutcomeRecord, context: dict) -> bool:
    """The cell asked for a quantized KV dtype and crashed only with its class's clear refusal of it
    (PLATFORM_REFUSALS), before any layer was seen."""
    refusal = PLATFORM_REFUSALS.get(record.get("signature") or "")
    return (refusal is not None and record.get("status") == "crash" and not record.get("layers")
            and context.get("kv_cache_dtype") not in UNQUANTIZED_KV_DTYPES and gpu_matches(refusal, context["gpu"]))
