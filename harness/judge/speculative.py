"""Speculative decoding's oracles, which need no expectation (matrix/expand.py pairs the cells):

- greedy equality: with greedy sampling a draft changes how fast the target decodes, never what it decodes. A
  draft cell's tokens are compared with its no-draft twin's (the same axes without the draft) by the differential
  rule's token comparison (differential.compare_tokens: exactly where an `expect:` rule says `tokens: exact`,
  else closely). Closely, because the target verifying several tokens a step computes in other GEMM shapes: where
  the tokens part, the positions both runs decoded under the same context (each sequence up to and including its
  first divergence) are compared as teacher-forced positions are (teacher_forced.distance), and the divergence is
  numerics while their typical distance stays within SHARED_CONTEXT_ALLOWED. Measured on the H200 (vLLM 0.34.0):
  a bf16 GLM target and its MTP draft agree to distance 0.0 at every position; the FP8-weight GLM (W8A8, whose
  FP8 GEMMs pick kernels by the token count) drifts by 0.001-0.005 at every position, prefill included, and parts
  at a 0.2-logprob swap of two tokens (distance 0.013 there, typical 0.004); a fault moves many positions by
  tenths (benchmarks/calibration.py's planted faults: 0.09 typical at least);
- acceptance: a draft that reads its KV cache wrong keeps the outputs right (the target verifies every token) and
  silently loses its speed. A draft cell's acceptance rate is compared with its plain twin's (the same draft, auto
  KV, no draft options, no forced backend, eager): a collapse (below 1 - MAX_RELATIVE_DROP of the plain twin's) is a
  FAIL naming both. Only where the plain twin's own acceptance says the draft predicts its target
  (MIN_PLAIN_ACCEPTANCE): a random-weight draft accepts next to nothing anywhere, and its figures are recorded as a
  relative signal only. Methods without a draft model (ngram, suffix) have no draft KV cache to read wrong: their
  acceptance follows the target's outputs and is recorded only.

Also built in: a forced draft attention backend must be the one the draft's layers run.
Only a cell that otherwise passes is turned into a failure; its figures are kept in `speculative` either way.
"""

from __future__ import annotations

from typing import Any

from kvmatrix.harness.judge.differential import compare_tokens
from kvmatrix.harness.judge.teacher_forced import MIN_TYPICAL, distance, non_finite_positions, typical
from kvmatrix.harness.judge.verdict import Judgement
from kvmatrix.harness.record.files import run_mode
from kvmatrix.harness.record.neighbours import Neighbours
from kvmatrix.harness.record.types import JudgedRecord, OutcomeRecord, RuleResult, SpeculativeComparison
from kvmatrix.matrix.conditions import when_matches
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.expectations import Differential
from kvmatrix.matrix.schema import MODEL_FREE_DRAFT_METHODS

GREEDY_RULE = "speculative: greedy outputs equal the no-draft twin's (built in)"
ACCEPTANCE_RULE = "speculative: acceptance holds against the plain twin (built in)"
FORCED_DRAFT_BACKEND_RULE = "a forced draft attention backend is the one the draft runs (built in)"
# A plain twin accepting less than this drafts next to nothing right (random weights): nothing to collapse from.
MIN_PLAIN_ACCEPTANCE = 0.2
MIN_DRAFT_TOKENS = 10  # fewer drafted tokens than this are too few to call a rate
MAX_RELATIVE_DROP = 0.5  # a cell accepting under half of what its plain twin accepts has collapsed
# Greedy divergence from the no-draft twin is numerics while the shared-context positions' typical distance stays
# within this: the teacher-forced rule's minimum for a quantized cache, whose numerics legitimately differ as a
# verify pass's do. Flips are not counted: with a few dozen positions a rate of 1-2 % cannot be told apart.
SHARED_CONTEXT_ALLOWED = MIN_TYPICAL["quantized"]


def judge_speculative(record: OutcomeRecord, judgement: Judgement, cell: Cell, neighbours: Neighbours,
                      gpu_name: str, context: dict[str, Any]) -> Judgement:
    """The judgement after the draft's built-in checks and its two oracles (the `neighbours`' draft twin and
    plain twin): with `speculative` for the record and its rows."""
    if not cell.axes.get("speculative") or record.get("status") != "ok":
        return judgement
    failures: list[str] = []
    rows: list[RuleResult] = []
    forced = context.get("draft_attention_backend")
    if forced and record.get("layers"):
        ok, detail = _forced_draft_backend(record, forced)
        if not ok and record.get("backend_notes"):
            return judgement.then("skip", f"{detail}: the platform cannot offer it (vLLM: "
                                          f"{record['backend_notes'][0]})")
        rows.append({"rule": FORCED_DRAFT_BACKEND_RULE, "ok": ok, "detail": detail})
        if not ok:
            failures.append(detail)
    comparison: SpeculativeComparison = {}
    if cell.draft_twin:
        failures += _greedy_equality(record, cell, neighbours.draft_twin, context, comparison, rows)
    plain = cell.plain_twin_on(gpu_name)
    method = ((record.get("engine_args") or {}).get("speculative_config") or {}).get("method")
    if plain and method not in MODEL_FREE_DRAFT_METHODS:
        failures += _acceptance(record, plain, neighbours.plain_twin, comparison, rows)
    judged = judgement.then(rows=rows, fields={"speculative": comparison} if comparison else None)
    if failures and judged.verdict in ("pass", "xfail"):
        return judged.then("fail", f"speculative: {failures[0]}")
    return judged


def _forced_draft_backend(record: OutcomeRecord, forced: str) -> tuple[bool, str]:
    ran = sorted({b for la in record.get("layers") or [] if la.get("role") == "draft" and (b := la.get("backend"))})
    replaced = [b for b in ran if b != forced]
    if replaced:
        return False, f"forced draft attention backend {forced}, the draft ran {', '.join(replaced)} instead"
    return True, f"the draft runs the forced {forced}" if ran else f"no draft layer recorded (forced {forced})"


def _twin_problem(record: OutcomeRecord, twin: JudgedRecord | None) -> str | None:
    """Why a twin's record cannot be compared with this one (None: it can); a twin the run lacks (selected out,
    not shipped, a run from before twins) is said so, never passed over silently."""
    if twin is None:
        return "the twin has no record in this run"
    if twin.get("status") != "ok":
        return f"the twin did not run ({twin.get('status')}: {twin.get('reason') or twin.get('signature') or ''})"
    if run_mode(twin) != run_mode(record):
        return f"the twin ran in {run_mode(twin)} mode, this cell in {run_mode(record)} mode"
    return None


def _greedy_equality(record: OutcomeRecord, cell: Cell, twin: JudgedRecord | None, context: dict[str, Any],
                     comparison: SpeculativeComparison, results: list[RuleResult]) -> list[str]:
    assert cell.draft_twin is not None, "called for a cell with a twin"
    comparison["twin"] = cell.draft_twin
    missing = _twin_problem(record, twin)
    if missing is not None:
        comparison["missing"] = missing
        results.append({"rule": GREEDY_RULE, "ok": True, "detail": f"not compared with {cell.draft_twin}: {missing}"})
        return []
    assert twin is not None, "an absent twin is missing"
    rule = cell.case.differential if cell.case.differential is not False else Differential()
    tokens = compare_tokens(record, {"tokens": twin.get("tokens") or [], "logprobs": twin.get("logprobs") or []},
                            _tokens_exact(cell, context), rule)
    if not tokens["ok"] and not tokens["exact"]:
        shared = shared_context(record, twin)
        comparison["shared_context"] = shared
        if shared["positions"] and not shared["non_finite"] and shared["typical"] <= SHARED_CONTEXT_ALLOWED:
            tokens = {**tokens, "ok": True, "detail": (
                f"{tokens['detail']}; numerics, not a fault: over the {shared['positions']} positions decoded under "
                f"the same context, distance {shared['typical']:.3g} typical (worst {shared['worst']:.3g}) <= "
                f"{SHARED_CONTEXT_ALLOWED:g}")}
        else:
            tokens = {**tokens, "detail": (
                f"{tokens['detail']}; over the {shared['positions']} positions decoded under the same context, "
                f"distance {shared['typical']:.3g} typical (worst {shared['worst']:.3g}) > {SHARED_CONTEXT_ALLOWED:g}"
                + (f", {shared['non_finite']} positions not finite" if shared["non_finite"] else ""))}
    comparison["tokens"] = tokens
    detail = f"vs {cell.draft_twin}: {tokens['detail']}"
    results.append({"rule": GREEDY_RULE, "ok": tokens["ok"], "detail": detail})
    return [] if tokens["ok"] else [f"greedy outputs differ from the no-draft twin {cell.draft_twin}: "
                                    f"{tokens['detail']}"]


def shared_context(record: OutcomeRecord, twin: JudgedRecord) -> dict[str, Any]:
    """The distance between a draft cell's and its twin's recorded top-k distributions at every position both
    decoded under the same context: each sequence up to and including its first divergence."""
    mine, theirs = record.get("logprobs") or [], twin.get("logprobs") or []
    distances: list[float] = []
    for s, (a, b) in enumerate(zip(record.get("tokens") or [], twin.get("tokens") or [], strict=False)):
        if s >= len(mine) or s >= len(theirs):
            break
        parted = next((p for p, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        end = min(len(mine[s]), len(theirs[s]), len(a) if parted is None else parted + 1)
        distances += [distance(theirs[s][p], mine[s][p]) for p in range(end) if mine[s][p] and theirs[s][p]]
    return {"positions": len(distances), "typical": typical(distances),
            "worst": round(max(distances, default=0.0), 5), "non_finite": len(non_finite_positions(mine))}


def _tokens_exact(cell: Cell, context: dict[str, Any]) -> bool:
    """An `expect:` rule's `tokens: exact` for this cell (the last that applies), as for a differential pair."""
    rules = [r for r in cell.case.expect if r.tokens is not None and when_matches(r.when, context)]
    return bool(rules) and rules[-1].tokens == "exact"


def _rate(record: OutcomeRecord) -> tuple[float | None, str]:
    run = record.get("spec_decode")
    if run is None:
        return None, "no spec-decode figures recorded (a record from before they were)"
    rate = run.get("acceptance_rate")
    if rate is None:
        return None, run.get("note") or "no tokens drafted"
    return rate, f"{rate:.2f} ({run.get('accepted_tokens')}/{run.get('draft_tokens')} draft tokens)"


def _acceptance(record: OutcomeRecord, plain_id: str, plain: JudgedRecord | None,
                comparison: SpeculativeComparison, results: list[RuleResult]) -> list[str]:
    if "spec_decode" not in record:  # a record from before the figures
        return []
    comparison["plain_twin"] = plain_id
    rate, mine = _rate(record)
    comparison["acceptance_rate"] = rate
    missing = _twin_problem(record, plain)
    if missing is not None:
        comparison["acceptance"] = f"not compared with {plain_id}: {missing}"
        results.append({"rule": ACCEPTANCE_RULE, "ok": True, "detail": comparison["acceptance"]})
        return []
    assert plain is not None, "an absent plain twin is missing"
    plain_rate, theirs = _rate(plain)
    comparison["plain_acceptance_rate"] = plain_rate
    drafted = (plain.get("spec_decode") or {}).get("draft_tokens") or 0
    if rate is None or plain_rate is None or plain_rate < MIN_PLAIN_ACCEPTANCE or drafted < MIN_DRAFT_TOKENS:
        detail = (f"recorded only: {mine} here, {theirs} on the plain twin {plain_id}, which is below "
                  f"{MIN_PLAIN_ACCEPTANCE} or {MIN_DRAFT_TOKENS} draft tokens (an untrained draft: a relative signal "
                  "at most)")
        comparison["acceptance"] = detail
        results.append({"rule": ACCEPTANCE_RULE, "ok": True, "detail": detail})
        return []
    floor = plain_rate * (1 - MAX_RELATIVE_DROP)
    ok = rate >= floor
    detail = (f"{mine} here vs {theirs} on the plain twin {plain_id}"
              + ("" if ok else f": collapsed below {floor:.2f} (a drop of more than {MAX_RELATIVE_DROP:.0%})"))
    comparison["acceptance"] = detail
    results.append({"rule": ACCEPTANCE_RULE, "ok": ok, "detail": detail})
    return [] if ok else [f"acceptance {detail}"]
