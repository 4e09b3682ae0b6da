"""Answers as evidence: where a case's model has learned a task and the case says each prompt's answer
(`generate: {answers: [...]}`, matrix/case.py), a differential cell's free-running answers are scored and paired
with its oracle's, with the accuracy baseline's statistics (paired_stats.py): garbage drops the score
significantly, noise does not."""

from __future__ import annotations

from typing import Any

from kvmatrix.harness.judge.paired_stats import paired_delta

CONFIDENCE = 0.95


def correct(text: str, answer: str) -> float:
    """1.0 where the generated text's first line is the answer (the task's exact match up to a line end)."""
    return 1.0 if text.split("\n", 1)[0] == answer else 0.0


def compare_answers(mine: list[str], theirs: list[str], answers: list[str]) -> dict[str, Any] | None:
    """The cell's answers paired with its oracle's (None where either has not one text per answer)."""
    if not answers or len(mine) != len(answers) or len(theirs) != len(answers):
        return None
    cell = [correct(t, a) for t, a in zip(mine, answers, strict=True)]
    oracle = [correct(t, a) for t, a in zip(theirs, answers, strict=True)]
    out: dict[str, Any] = dict(paired_delta(oracle, cell, CONFIDENCE))
    out["right"], out["oracle_right"] = int(sum(cell)), int(sum(oracle))
    out["dropped"] = bool(out["significant"] and out["delta"] < 0)
    return out


def describe(comparison: dict[str, Any]) -> str:
    low, high = comparison["interval"]
    return (f"{comparison['right']}/{comparison['n']} answers right, the oracle {comparison['oracle_right']}/"
            f"{comparison['n']}: delta {comparison['delta']:+.3f} [{low:+.3f}, {high:+.3f}] at "
            f"{comparison['confidence']:.0%}")
