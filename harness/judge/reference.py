"""A cell against its model's reference: a comparison outside the configuration under test.

Every other check of a generating cell compares it with its own eager twin (the same model, backend and KV dtype),
which shares a fault that acts in every mode: an attention backend reading an fp8 cache at the wrong scale in
prefill and decode, eager and graphs alike, passes against its twin. The reference is an ordinary cell of the case
(matrix/expand.py `reference_axes`): the model as it ships with an unquantized cache (`bfloat16`), eager, plain, on
the class's default backend, run first. Every other plain cell of the case is compared with it:

- the cell decoded the reference's greedy tokens teacher-forced through its own decode path (harness/cell/
  forced.py `forced_reference`), so every position is scored under the reference's very context: its typical
  distance and top-1 flip rate must stay within the teacher-forced rule's allowance (teacher_forced.py
  `judge_forced`: FLOOR_FACTOR x the reference's own noise floor where it recorded one, at least the calibrated
  allowance of the cell's kind against a bf16 reference, allowances.py `against: reference`: the KV dtype's own
  quantization cost as clean cells of every backend storing it measured, and the execution's; the allowance names
  the peers that measured it). Where the forced decode is missing (vLLM forces no decode with a draft, the forced
  pass raised, the forcing did not act), the positions both decoded free-running under the same context (each
  sequence up to and including its first divergence) are judged by the same allowance instead, and the record says
  "not teacher-forced" and why; a record from before cells decoded the reference's tokens (no `forced_reference`)
  is judged so, as it was; so is a cell on a device kind whose calibration never measured clean cells forced on
  their reference (allowances.py `forced_on_reference_calibrated`; every CUDA entry today): the forced numbers are
  kept in `teacher_forced_uncalibrated`, and judge nothing until a calibration there measures them;
- where the case gives each prompt's answer, the cell's answers are scored against the task's truth and paired
  with the reference's: a significant drop fails, with its interval (answers.py).

A reference that generated nothing (its own record says why) compares nothing; one that resolved a quantized cache
(an fp8 checkpoint's `auto`), ran in another mode or whose own decode is not reproducible (its noise floor fails)
compares nothing and says so: never a failure. Only a cell that
otherwise passes is turned into a failure, its reason naming each failed check (an answer drop first, then the
distance); the comparison is kept in the record's `reference` either way.
"""

from __future__ import annotations

from typing import Any

from kvmatrix.harness.judge.allowances import calibrated, forced_on_reference_calibrated, kv_kind
from kvmatrix.harness.judge.answers import compare_answers
from kvmatrix.harness.judge.answers import describe as describe_answers
from kvmatrix.harness.judge.teacher_forced import floor_of, judge_forced, judge_shared_context, summarize, unusable
from kvmatrix.harness.judge.verdict import Judgement
from kvmatrix.harness.record.files import run_mode
from kvmatrix.harness.record.types import ForcedRun, JudgedRecord, OutcomeRecord, Reference, RuleResult
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
        return judged.then("fail", f"against the model's bf16 reference {reference_id}: {'; '.join(failures)}")
    return judged


def _compared(record: OutcomeRecord, reference: JudgedRecord, cell: Cell, device: str | None, title: str,
              comparison: dict[str, Any], rows: list[RuleResult]) -> list[str]:
    """The distance (teacher-forced on the reference's tokens, else under the same context) and the answers (into
    `comparison` and `rows`); what fails, an answer drop first."""
    draft = bool((record.get("axes") or {}).get("speculative"))
    allowance = calibrated(record, device, draft, against="reference")
    theirs: Reference = {"tokens": reference.get("tokens") or [], "logprobs": reference.get("logprobs") or []}
    forced, not_forced = _forced_run(record, theirs)
    tie_tolerance = cell.case.differential.tie_tolerance if cell.case.differential else 0.0
    if forced is not None and not forced_on_reference_calibrated(device):
        comparison["teacher_forced_uncalibrated"] = summarize(theirs["tokens"], theirs["logprobs"],
                                                              forced["logprobs"], tie_tolerance)
        forced, not_forced = None, (f"no {device or 'cuda'} calibration measured cells forced on their reference "
                                    "(the forced decode's numbers are recorded, not judged)")
    if forced is not None:
        floor, floor_missing = floor_of(theirs["tokens"], theirs["logprobs"], reference.get("noise_floor"),
                                        tie_tolerance)
        result = judge_forced(forced, theirs, floor, floor_missing and _as_reference(floor_missing), allowance,
                              tie_tolerance)
        result["detail"] = _as_reference(result["detail"])
        comparison["teacher_forced"] = result
        rows.append({"rule": f"{title}: teacher-forced on the reference's tokens", "ok": result["ok"],
                     "detail": result["detail"]})
    else:
        result = judge_shared_context(record, reference, allowance)
        comparison["shared_context"] = result
        if not_forced is not None:
            comparison["teacher_forced_missing"] = not_forced
            result["detail"] = f"not teacher-forced: {not_forced}; {result['detail']}"
        rows.append({"rule": f"{title}: distance under the same context", "ok": result["ok"],
                     "detail": result["detail"]})
    failures = [] if result["ok"] else [result["detail"]]
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


def _forced_run(record: OutcomeRecord, theirs: Reference) -> tuple[ForcedRun | None, str | None]:
    """(the cell's forced decode of the reference's tokens, or None and why it has none usable; None for both: a
    record from before cells decoded the reference's tokens)."""
    if "forced_reference" not in record:
        return None, None
    forced: ForcedRun | None = record["forced_reference"]
    if forced and forced.get("decoded_as") == "forced":  # the reference is the cell's oracle: one decode serves
        forced = record.get("forced")
    problem = unusable(forced, theirs)
    return (None, _as_reference(problem)) if problem is not None else (forced, None)


def _as_reference(text: str) -> str:
    """The teacher-forced rule's words, which speak of an oracle, for the reference."""
    return text.replace("the oracle", "the reference").replace("its oracle", "the reference")


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
