"""The one judging path: a record (fresh from a cell, or stored) → its final verdict and reason, with the
per-rule results. Used by every pool, `kvmatrix rejudge`, `kvmatrix audit` and the pytest front end.

In order: the case's expectations (harness/judge/verdict.py); accuracy against the baseline cell
(accuracy.py); a failure emulation cannot reproduce is `skip`, a failure of the environment (not vLLM) is
`error`; a cell that failed and then passed on retry stays a (flaky) failure; a known failure
(cases/_waivers.txt) is `xfail` with its link.
"""

from __future__ import annotations

from harness.judge.accuracy import judge_accuracy
from harness.judge.verdict import judge
from harness.records import RunDir
from harness.task import Task
from harness.vllm_compat import ENVIRONMENT_SIGNATURES, NOT_EMULABLE_SIGNATURES, normalize_record


def judge_record(record: dict, task: Task, run_dir: RunDir) -> dict:
    """Set a record's verdict, reason and per-rule results from the case's expectations (and the baseline's
    accuracy); also used to judge stored records again after a case or signature change."""
    context = task.context(record.get("vllm_version"))
    normalize_record(record)
    verdict, reason, results = judge(record, task.cell.case.expect, context)
    if task.cell.baseline_id is not None:
        verdict, reason = judge_accuracy(record, task.cell, run_dir, task.gpu_name, context, verdict, reason,
                                         results)
    record.pop("not_emulable", None)
    if task.emulated_from and record.get("signature") in NOT_EMULABLE_SIGNATURES:
        verdict, reason = "skip", f"not emulable on {task.emulated_from}: {record.get('error_tail')}"
        record["not_emulable"] = True
    elif record.get("signature") in ENVIRONMENT_SIGNATURES:
        verdict, reason = "error", f"environment, not vLLM: {record.get('error_tail')}"
    record.update(expectations=results, verdict=verdict, reason=reason, tags=list(task.cell.case.tags))
    return record
