"""Greedy tokens of two runs of the same prompts compared sequence by sequence (a differential cell and its oracle,
a draft cell and its no-draft twin): exactly where an `expect:` rule says `tokens: exact`, else closely (each chosen
token's logprob within the differential's `logprob_tolerance` up to the first divergence, the divergence a near tie
within `tie_tolerance`), and the words that describe the result. Where a teacher-forced decode (or a shared context)
judges a pair instead, the free-running tokens are described as evidence only (`describe_free_running`)."""

from __future__ import annotations

from typing import Any

from kvmatrix.harness.record.types import OutcomeRecord, Reference, TokenComparison
from kvmatrix.matrix.conditions import when_matches
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.expectations import Differential


def _lp(position: dict[str, float] | None, token: int) -> float | None:
    return None if position is None else position.get(str(token))


def _lead(position: dict[str, float] | None, chosen: int, other: int) -> list[float]:
    """[logprob of the chosen token - the other's] at one position, or [] where the other's is not recorded."""
    other_lp = _lp(position, other)
    if other_lp is None:
        return []
    chosen_lp = _lp(position, chosen)
    assert chosen_lp is not None, "a position's logprobs hold the token chosen there"
    return [chosen_lp - other_lp]


def compare_sequence(mine: list[int], theirs: list[int], mine_lp: list[dict] | None, theirs_lp: list[dict] | None,
                     exact: bool, logprob_tolerance: float, tie_tolerance: float) -> dict[str, Any]:
    """One sequence against the oracle's: the first divergent token (index, the oracle's and this cell's), the
    largest difference of a chosen token's logprob before it, and whether they agree (exact: the same tokens; else
    close: logprobs within tolerance up to the divergence, and the divergence a near tie)."""
    index = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
    if index is None and len(mine) != len(theirs):
        index = min(len(mine), len(theirs))
    out: dict[str, Any] = {"first_divergence": index}
    if index is not None:
        out["oracle_token"] = theirs[index] if index < len(theirs) else None
        out["token"] = mine[index] if index < len(mine) else None
    if exact:
        out["ok"] = index is None
        return out
    if not mine_lp or not theirs_lp:
        out["ok"] = index is None
        out["note"] = "no logprobs recorded: compared exactly"
        return out
    upto = len(mine) if index is None else index
    deltas = [abs(a - b) for i in range(min(upto, len(mine_lp), len(theirs_lp)))
              if (a := _lp(mine_lp[i], mine[i])) is not None and (b := _lp(theirs_lp[i], theirs[i])) is not None]
    out["max_logprob_delta"] = round(max(deltas), 5) if deltas else 0.0
    ok = out["max_logprob_delta"] <= logprob_tolerance
    if index is not None:
        # How far each side's chosen token is ahead of the other's, where the other's is among its logprobs.
        gaps = []
        if out["token"] is not None and index < len(theirs_lp):
            gaps += _lead(theirs_lp[index], out["oracle_token"], out["token"])
        if out["oracle_token"] is not None and index < len(mine_lp):
            gaps += _lead(mine_lp[index], out["token"], out["oracle_token"])
        out["tie_gap"] = round(min(abs(g) for g in gaps), 5) if gaps else None
        ok = ok and out["tie_gap"] is not None and out["tie_gap"] <= tie_tolerance
    out["ok"] = ok
    return out


# The close rule of one sequence, every function it calls: `kvmatrix repro` copies them into a script verbatim.
SEQUENCE_RULE = (_lp, _lead, compare_sequence)


def compare_tokens(mine: OutcomeRecord | Reference, theirs: Reference, exact: bool, rule: Differential
                   ) -> TokenComparison:
    """Every sequence of `mine` (tokens, logprobs) against `theirs`: per-sequence results, and the first that does
    not agree."""
    mine_lp, theirs_lp = mine.get("logprobs") or [], theirs.get("logprobs") or []
    sequences = [compare_sequence(a, b, mine_lp[s] if mine_lp else None, theirs_lp[s] if theirs_lp else None,
                                  exact, rule.logprob_tolerance, rule.tie_tolerance)
                 for s, (a, b) in enumerate(zip(mine["tokens"], theirs["tokens"], strict=False))]
    out: TokenComparison = {"exact": exact, "sequences": len(sequences),
                            "identical": sum(1 for s in sequences if s["first_divergence"] is None),
                            "per_sequence": sequences}
    if len(mine["tokens"]) != len(theirs["tokens"]):
        out["ok"] = False
        out["detail"] = f"{len(mine['tokens'])} sequences, the oracle {len(theirs['tokens'])}"
        return out
    bad = next((s for s, seq in enumerate(sequences) if not seq["ok"]), None)
    out["ok"] = bad is None
    out["detail"] = describe_tokens(sequences, bad, exact, rule)
    return out


def describe_tokens(sequences: list[dict], bad: int | None, exact: bool, rule: Differential) -> str:
    identical = sum(1 for s in sequences if s["first_divergence"] is None)
    head = f"{identical}/{len(sequences)} sequences identical" + (" (exact)" if exact else "")
    if bad is None:
        deltas = [s.get("max_logprob_delta") or 0.0 for s in sequences]
        return head + (f", logprobs within {max(deltas):.3g} of the oracle's" if not exact and deltas else "")
    seq = sequences[bad]
    text = f"{head}; sequence {bad}"
    if seq["first_divergence"] is not None:
        text += (f" first diverges at token {seq['first_divergence']}: oracle {seq['oracle_token']}, this cell "
                 f"{seq['token']}")
        if not exact:
            gap = seq.get("tie_gap")
            if gap is None:
                text += " (not a near tie: neither token is in the other run's top logprobs)"
            elif gap > rule.tie_tolerance:
                text += f" (not a near tie: logprob gap {gap:.3g} > {rule.tie_tolerance:g})"
    if not exact and (seq.get("max_logprob_delta") or 0) > rule.logprob_tolerance:
        text += (f"; a chosen token's logprob differs by {seq['max_logprob_delta']:.3g} from the oracle's "
                 f"(tolerance {rule.logprob_tolerance:g})")
    return text


def describe_free_running(sequences: list[dict]) -> str:
    """The free-running tokens as evidence, judging nothing: how many sequences are identical and where the first
    of the others diverges."""
    identical = sum(1 for s in sequences if s["first_divergence"] is None)
    text = f"{identical}/{len(sequences)} sequences identical"
    first = next(((i, s) for i, s in enumerate(sequences) if s["first_divergence"] is not None), None)
    if first is not None:
        i, seq = first
        text += (f"; sequence {i} first diverges at token {seq['first_divergence']} (oracle {seq['oracle_token']}, "
                 f"this cell {seq['token']})")
    return text


def tokens_exact(cell: Cell, context: dict[str, Any]) -> bool:
    """Whether an `expect:` rule says `tokens: exact` for this cell (the last that applies)."""
    rules = [r for r in cell.case.expect if r.tokens is not None and when_matches(r.when, context)]
    return bool(rules) and rules[-1].tokens == "exact"
