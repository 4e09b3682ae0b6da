"""Accuracy → verdict: a cell's per-sample scores against its baseline cell's, paired on the same samples.

The baseline cell (matrix/expand.py: `Cell.baseline_id`) runs first; its record is passed in (record/neighbours.py).
A cell fails when its drop is significant (the interval excludes zero) and larger than the case's `max_drop`;
under an `expected_drops` rule that same drop is `xfail`, and no drop fails (the loss is gone: update the case).
Only a cell that otherwise passes is re-judged: a crash or a failed check already decides.
"""

from __future__ import annotations

import math
from typing import Any

from kvmatrix.harness.judge.paired_stats import divergence, paired_delta
from kvmatrix.harness.judge.verdict import Judgement
from kvmatrix.harness.record.files import run_mode
from kvmatrix.harness.record.types import AccuracyComparison, JudgedRecord, OutcomeRecord, RuleResult
from kvmatrix.matrix.conditions import when_matches
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.expectations import Accuracy


def compare(record: OutcomeRecord, baseline: JudgedRecord | None, baseline_id: str, confidence: float
            ) -> AccuracyComparison:
    """What the record carries as `accuracy_vs_baseline`: delta, interval, n, p-value, divergence, or why not."""
    out: AccuracyComparison = {"baseline": baseline_id}
    if baseline is not None and run_mode(baseline) != run_mode(record):
        # A probe-only record's tokens are a prefix of a full one's: comparing them would be a false failure.
        return {**out, "missing": f"not compared: the baseline ran in {run_mode(baseline)} mode, this cell in "
                                  f"{run_mode(record)} mode"}
    mine, theirs = record.get("accuracy"), baseline.get("accuracy") if baseline is not None else None
    if not theirs:
        return {**out, "missing": "no baseline" + ("" if baseline is None else " accuracy: the baseline cell "
                                                   f"ended {baseline.get('verdict')} ({baseline.get('reason')})")}
    if not mine:
        return {**out, "missing": "this cell recorded no accuracy"}
    index = {d: i for i, d in enumerate(theirs["doc_ids"])}
    pairs = [(index[d], i) for i, d in enumerate(mine["doc_ids"]) if d in index]
    if not pairs:
        return {**out, "missing": "no sample in common with the baseline"}
    out.update(paired_delta([theirs["samples"][b] for b, _ in pairs], [mine["samples"][c] for _, c in pairs],
                            confidence))
    out.update(divergence([theirs["tokens"][b] for b, _ in pairs], [mine["tokens"][c] for _, c in pairs]))
    return out


def describe(comparison: AccuracyComparison) -> str:
    low, high = comparison["interval"]
    return (f"accuracy {comparison['score']:.3f} vs baseline {comparison['baseline_score']:.3f}: "
            f"delta {comparison['delta']:+.3f} [{low:+.3f}, {high:+.3f}] at {comparison['confidence']:.0%}, "
            f"n={comparison['n']}")


def judge_accuracy(record: OutcomeRecord, judgement: Judgement, cell: Cell, baseline: JudgedRecord | None,
                   context: dict[str, Any]) -> Judgement:
    """The judgement after accuracy against the cell's `baseline` record (None: not in the run): with
    `accuracy_vs_baseline` for the record and its rule's row."""
    accuracy, baseline_id = cell.case.accuracy, cell.baseline_id
    assert accuracy is not None and baseline_id is not None, "judged only for a cell with an accuracy baseline"
    if judgement.verdict != "pass":
        return judgement
    if cell.cell_id == baseline_id:
        return _judge_baseline(record, accuracy, judgement)
    comparison = compare(record, baseline, baseline_id, accuracy.confidence)
    compared = judgement.then(fields={"accuracy_vs_baseline": comparison})
    rule, reason = f"accuracy vs {cell.baseline_id}: max_drop {accuracy.max_drop}", judgement.reason
    if "missing" in comparison:
        return compared.then(reason=f"{reason}; {comparison['missing']}",
                             rows=[{"rule": rule, "ok": True, "detail": comparison["missing"]}])
    text = describe(comparison)
    dropped = comparison["significant"] and comparison["delta"] < -accuracy.max_drop
    expected = next((r for r in accuracy.expected_drops if when_matches(r.when, context)), None)
    if expected is not None:
        link = f" ({expected.link})" if expected.link else ""
        row: RuleResult = {"rule": f"{rule}, expected drop", "ok": dropped, "detail": text}
        if dropped:
            return compared.then("xfail", f"expected accuracy drop{link}: {text}; {expected.reason}", [row])
        return compared.then("fail", f"expected accuracy drop did not happen{link}: {text}", [row])
    row = {"rule": rule, "ok": not dropped, "detail": text}
    if dropped:
        return compared.then("fail", f"significant accuracy drop beyond {accuracy.max_drop}: {text}", [row])
    return compared.then(reason=f"{reason}; {text}", rows=[row])


def _judge_baseline(record: OutcomeRecord, accuracy: Accuracy, judgement: Judgement) -> Judgement:
    mine = record.get("accuracy")
    if not mine:
        return judgement.then("error", "an accuracy case's baseline recorded no accuracy")
    text = f"baseline accuracy {mine['score']:.3f} (n={mine['n']})"
    if accuracy.pinned is None:
        return judgement.then(reason=f"{judgement.reason}; {text}")
    pinned = accuracy.pinned
    ok = math.isclose(mine["score"], pinned.value, rel_tol=pinned.rtol)
    row: RuleResult = {"rule": f"accuracy pinned at {pinned.value} (rtol {pinned.rtol})", "ok": ok, "detail": text}
    if ok:
        return judgement.then(reason=f"{judgement.reason}; {text}", rows=[row])
    return judgement.then("fail", f"{text}, pinned at {pinned.value} ± {pinned.rtol:.0%}", [row])
