"""A cell against its model's reference: a comparison outside the configuration under test.

Every other check of a generating cell compares it with its own eager twin (the same model, backend and KV dtype),
which shares a fault that acts in every mode: an attention backend reading an fp8 cache at the wrong scale in
prefill and decode, eager and graphs alike, passes against its twin. The reference is an ordinary cell of the case
(matrix/expand.py `reference_axes`): the model as it ships with an unquantized cache (`bfloat16`), eager, plain, on
the class's default backend, run first. Every other plain cell of the case is compared with it:

- the positions both decoded under the same context (each sequence up to and including its first divergence; the
  prompts are the case's own) must stay within the calibrated allowance of the cell's kind against a bf16
  reference (allowances.py, `against: reference`: the KV dtype's own quantization cost as clean cells of every
  backend storing it measured, and the execution's; the allowance names the peers that measured it);
- where the case gives each prompt's answer, the cell's answers are scored against the task's truth and paired
  with the reference's: a significant drop fails, with its interval (answers.py).

A reference that generated nothing (its own record says why) compares nothing; one that resolved a quantized cache
(an fp8 checkpoint's `auto`), ran in another mode or whose own decode is not reproducible (its noise floor fails)
compares nothing and says so: never a failure. Only a cell that
otherwise passes is turned into a failure; the comparison is kept in the record's `reference` either way.
"""

from __future__ import annotations

from typing import Any

from kvmatrix.harness.judge.allowances import calibrated, kv_kind
from kvmatrix.harness.judge.answers import compare_answers
from kvmatrix.harness.judge.answers import describe as describe_answers
from kvmatrix.harness.judge.teacher_forced import judge_shared_context
from kvmatrix.harness.judge.verdict import Judgement
from kvmatrix.harness.record.files import run_mode
from kvmatrix.harness.record.types import JudgedRecord, OutcomeRecord, RuleResult
from kvmatrix.matrix.expand import Cell

RULE = "against the model's bf16 reference"


def judge_reference(record: OutcomeRecord, judgement: Judgement, cell: Cell, reference: JudgedRecord | None,
                    gpu_name: str, device: str | None) -> Judgement:
    """The judgement after the comparison with the cell's model reference on its class (None: not in the run):
    with `reference` for the record and its rows."""
    reference_id = cell.reference_on(gpu_name)
    if reference_id is None or record.get("status") != "ok" or _before_references(record, reference):
        return judgement
    title = f"{RULE} {reference_id}"
    comparison: dict[str, Any] = {"reference": reference_id}
    missing = _missing(record, reference)
    if missing is not None:
        comparison["missing"] = missing
        return judgement.then(rows=[{"rule": title, "ok": True, "detail": f"not compared: {missing}"}],
                              fields={"reference": comparison})
    assert reference is not None, "an absent reference is missing"
    rows: list[RuleResult] = []
    failures = _compared(record, reference, cell, device, title, comparison, rows)
    judged = judgement.then(rows=rows, fields={"reference": comparison})
    if failures and judged.verdict == "pass":
        return judged.then("fail", f"against the model's bf16 reference {reference_id}: {failures[0]}")
    return judged


def _compared(record: OutcomeRecord, reference: JudgedRecord, cell: Cell, device: str | None, title: str,
              comparison: dict[str, Any], rows: list[RuleResult]) -> list[str]:
    """The distance under the same context and the answers (into `comparison` and `rows`); what fails."""
    failures: list[str] = []
    draft = bool((record.get("axes") or {}).get("speculative"))
    shared = judge_shared_context(record, reference, calibrated(record, device, draft, against="reference"))
    comparison["shared_context"] = shared
    rows.append({"rule": f"{title}: distance under the same context", "ok": shared["ok"], "detail": shared["detail"]})
    if not shared["ok"]:
        failures.append(shared["detail"])
    answers = cell.case.generate.answers
    paired = compare_answers(record.get("texts") or [], reference.get("texts") or [], answers) if answers else None
    if paired is not None:
        comparison["answers"] = paired
        detail = describe_answers(paired).replace("the oracle", "the reference")
        rows.append({"rule": f"{title}: answers against the task's truth", "ok": not paired["dropped"],
                     "detail": detail})
        if paired["dropped"]:
            failures.insert(0, f"significant answer drop: {detail}")
    return failures


def _before_references(record: OutcomeRecord, reference: JudgedRecord | None) -> bool:
    """Nothing to compare, said nowhere: a run from before model references (none in its folder, or no logprobs
    on either side), or a reference that generated nothing (its own record says why: a crash, a skip)."""
    return reference is None or not (reference.get("logprobs") and record.get("logprobs"))


def _missing(record: OutcomeRecord, reference: JudgedRecord | None) -> str | None:
    """Why the cell cannot be compared with its reference (None: it can)."""
    assert reference is not None, "a run without the reference is judged as it was"
    if run_mode(reference) != run_mode(record):
        return f"the reference ran in {run_mode(reference)} mode, this cell in {run_mode(record)} mode"
    if (reference.get("noise_floor_summary") or {}).get("ok") is False:
        return "the reference's own decode is not reproducible (it fails its noise floor)"
    if kv_kind(reference) != "unquantized":
        return "the reference resolved a quantized cache (the checkpoint's `auto`)"
    return None
