"""The parts of a cell record that judging adds (harness/judge/), one TypedDict each, open to other keys: rule
results, the accuracy, differential and speculative comparisons, a known failure's note and a waiver. What the cell
observed is parts.py's."""

from __future__ import annotations

from typing import Any

from typing_extensions import TypedDict

from kvmatrix.harness.record.parts import Verdict, open_to_other_keys


@open_to_other_keys
class RuleResult(TypedDict, total=False):
    """One applicable expectation's check."""

    rule: str
    ok: bool
    detail: str


@open_to_other_keys
class AccuracyComparison(TypedDict, total=False):
    """The cell's accuracy paired with its baseline cell's (harness/judge/accuracy.py), or why it is not."""

    baseline: str
    missing: str
    n: int
    baseline_score: float
    score: float
    delta: float
    interval: list[float]
    confidence: float
    significant: bool
    mcnemar_p: float
    sequences: int
    identical_fraction: float
    first_divergence: int | None


@open_to_other_keys
class TokenComparison(TypedDict, total=False):
    """A differential cell's greedy tokens against its oracle's (harness/judge/differential.py)."""

    exact: bool
    sequences: int
    identical: int
    per_sequence: list[dict]
    ok: bool
    detail: str


@open_to_other_keys
class DifferentialComparison(TypedDict, total=False):
    """A cell against its oracle (harness/judge/differential.py): the pair, the modes, and what was compared."""

    oracle: str
    mode: str
    oracle_mode: str
    missing: str
    crash: str
    state: list[str]
    tokens: TokenComparison
    tokens_missing: str
    accuracy: AccuracyComparison
    teacher_forced: dict[str, Any]  # harness/judge/teacher_forced.py: the cell's distance, the floor, the rule
    teacher_forced_missing: str  # why the pair was compared free-running only
    # Without a forced decode (a draft, an older record): the distance under the same context, within the
    # calibrated allowance (harness/judge/teacher_forced.py judge_shared_context)
    shared_context: dict[str, Any]
    answers: dict[str, Any]  # harness/judge/answers.py: task correctness, paired with the oracle's


@open_to_other_keys
class SpecDecodeRun(TypedDict, total=False):
    """A draft cell's generation as vLLM's spec-decode counters saw it (harness/cell/spec_decode.py)."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: list[int]
    acceptance_rate: float
    mean_acceptance_length: float
    note: str


@open_to_other_keys
class SpeculativeComparison(TypedDict, total=False):
    """A draft cell against its twins (harness/judge/speculative.py): its greedy outputs against the no-draft
    twin's, its acceptance against the plain twin's."""

    twin: str
    tokens: TokenComparison
    missing: str
    plain_twin: str
    acceptance_rate: float | None
    plain_acceptance_rate: float | None
    acceptance: str
    shared_context: dict  # where the greedy tokens part: the distance over the positions both decoded alike


@open_to_other_keys
class KnownFailureNote(TypedDict, total=False):
    """A failure of a user's own case that kvmatrix's own cases or waivers know for this vLLM (harness/judge/
    known_failures.py): the verdict it had, where it is tracked, what knows it, and the rule to copy."""

    verdict: Verdict
    link: str
    source: str
    rule: str
    page: str


@open_to_other_keys
class Waived(TypedDict, total=False):
    """The verdict a waiver turned into `xfail`, and the waiver (harness/judge/waivers.py)."""

    verdict: Verdict
    waiver: str
    link: str
    finding: str  # a finding's waiver (vllm_compat/findings.py): the finding it waived the record by
    beyond: bool  # that waiver holds here beyond the cells it was written for
