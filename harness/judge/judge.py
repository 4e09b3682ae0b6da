"""The one judging path: an outcome record (fresh from a cell, or a stored record judged again) → its judged
record: the final verdict and reason, with the per-rule results. Used by both pools (this machine's and Ray's),
`kvmatrix run`, `rejudge` and `audit`, and the pytest front end, so every front end gives a record the same
verdict.

In order: the case's expectations (verdict.py); accuracy against the baseline cell (accuracy.py); a workload that
did not take its runtime path, the comparison with the cell's oracle, and an oracle's own noise floor
(differential.py); a draft cell's greedy outputs against its no-draft twin and its acceptance against its plain
twin (speculative.py); a failure
emulation cannot reproduce is `skip`, a failure of the environment (not vLLM) is `error`, a class's clear refusal
of what its hardware cannot run is `skip`; a cell that failed
and then passed on a retry stays a (flaky) failure; a known failure (cases/_waivers.txt, waivers.py) is `xfail`
with its link, and so is a user's case failing as kvmatrix's own cases or waivers know this vLLM fails
(known_failures.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import cast

from kvmatrix.harness.judge.accuracy import judge_accuracy
from kvmatrix.harness.judge.differential import judge_differential, judge_oracle_floor, judge_workload
from kvmatrix.harness.judge.known_failures import explain
from kvmatrix.harness.judge.speculative import judge_speculative
from kvmatrix.harness.judge.verdict import judge
from kvmatrix.harness.judge.waivers import Waiver, waive
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.model import JudgedRecord, OutcomeRecord, check_judged
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.vllm_compat import (
    ENVIRONMENT_SIGNATURES,
    NOT_EMULABLE_SIGNATURES,
    PLATFORM_REFUSALS,
    normalize_record,
)
from kvmatrix.harness.vllm_compat.declarations import UNQUANTIZED_KV_DTYPES
from kvmatrix.matrix.conditions import gpu_matches


def judge_record(outcome: OutcomeRecord, task: Task, run_dir: RunDir, waivers: Sequence[Waiver] = (),
                 first_failure: str | None = None, today: datetime.date | None = None) -> JudgedRecord:
    """The outcome record judged: its final verdict, reason and per-rule results set in place, so its fields
    keep their order in the JSON; returned checked as a judged record. `first_failure` is the reason an earlier
    attempt of the same cell failed with (a retry); a stored record judged again keeps its `flaky` mark. Stored
    records are judged again from scratch: a waiver applied earlier is undone first."""
    # The parts of the judgement go in as they are decided (a fresh record gets its verdict only at the end):
    # check_judged holds it to one.
    record = cast(JudgedRecord, outcome)
    record.pop("waived", None)
    record.pop("known_failure", None)
    context = task.context(record.get("vllm_version"))
    normalize_record(record)
    judged = judge(record, task.cell.case.expect, context)
    verdict, reason, results = judged.verdict, judged.reason, judged.results
    if task.cell.baseline_id is not None:
        verdict, reason = judge_accuracy(record, task.cell, run_dir, task.gpu_name, context, verdict, reason,
                                         results)
    record.pop("differential", None)
    record.pop("noise_floor_summary", None)
    verdict, reason = judge_workload(record, verdict, reason, results, task.gpu.device)
    verdict, reason = judge_differential(record, task.cell, run_dir, task.gpu_name, task.gpu.device, context,
                                         verdict, reason, results)
    verdict, reason = judge_oracle_floor(record, task.cell, task.gpu_name, verdict, reason, results)
    record.pop("speculative", None)
    verdict, reason = judge_speculative(record, task.cell, run_dir, task.gpu_name, context, verdict, reason, results)
    record.pop("not_emulable", None)
    if task.emulated_from and record.get("signature") in NOT_EMULABLE_SIGNATURES:
        verdict, reason = "skip", f"not emulable on {task.emulated_from}: {record.get('error_tail')}"
        record["not_emulable"] = True
    elif record.get("signature") in ENVIRONMENT_SIGNATURES:
        verdict, reason = "error", f"environment, not vLLM: {record.get('error_tail')}"
    elif verdict == "fail" and _refused_by_platform(record, context):
        verdict, reason = "skip", f"{task.gpu_name} cannot run this, as vLLM says at start: {record.get('error_tail')}"
    if first_failure is not None and verdict == "pass":
        record.update({"flaky": True, "first_failure": first_failure})
    if record.get("flaky") and verdict == "pass":
        first = f" ({record['first_failure']})" if record.get("first_failure") else ""
        verdict, reason = "fail", f"flaky: failed first{first}, then passed"
    record.update({"expectations": results, "verdict": verdict, "reason": reason, "tags": list(task.cell.case.tags)})
    waived, _ = waive(record, waivers, today)  # a "removable" waiver is reported over the whole run
    record.update(explain(waived, task, today))  # a user's case failing as kvmatrix knows this vLLM fails
    return check_judged(record, f"the judged record of {task.key}")


def _refused_by_platform(record: JudgedRecord, context: dict) -> bool:
    """The cell asked for a quantized KV dtype and crashed only with its class's clear refusal of it
    (PLATFORM_REFUSALS), before any layer was seen."""
    refusal = PLATFORM_REFUSALS.get(record.get("signature") or "")
    return (refusal is not None and record.get("status") == "crash" and not record.get("layers")
            and context.get("kv_cache_dtype") not in UNQUANTIZED_KV_DTYPES and gpu_matches(refusal, context["gpu"]))
