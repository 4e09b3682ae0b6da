"""Paired comparison of one cell's per-sample scores with its baseline cell's, on the same samples.

The interval is scipy's paired bootstrap of the mean per-sample difference; for 0/1 scores McNemar's exact test
(statsmodels) gives a p-value on the discordant pairs. Both are seeded, so a rerun reports the same numbers.
Greedy token sequences are compared too: the fraction that are identical and where the first one diverges.
"""

from __future__ import annotations

import numpy as np

from kvmatrix.harness.record.types import AccuracyComparison

RESAMPLES = 4000
SEED = 0


def paired_delta(baseline: list[float], cell: list[float], confidence: float = 0.95) -> AccuracyComparison:
    """Mean of (cell - baseline) with its bootstrap interval; `significant` when the interval excludes zero."""
    b, c = np.asarray(baseline, dtype=float), np.asarray(cell, dtype=float)
    if b.shape != c.shape or b.size == 0:
        raise ValueError(f"paired samples need equal, non-zero lengths (baseline {b.size}, cell {c.size})")
    diff = c - b
    delta = float(diff.mean())
    if np.all(diff == diff[0]):
        low = high = delta  # every resample has this mean; scipy would warn about the degenerate distribution
    else:
        from scipy import stats  # imported as a comparison is made: with statsmodels, 5 s of every command's start

        res = stats.bootstrap(
            (b, c), lambda x, y, axis: np.mean(y - x, axis=axis), paired=True, vectorized=True,
            confidence_level=confidence, n_resamples=RESAMPLES, method="percentile",
            random_state=np.random.default_rng(SEED),
        )
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    out: AccuracyComparison = {
        "n": int(b.size), "baseline_score": float(b.mean()), "score": float(c.mean()), "delta": delta,
        "interval": [low, high], "confidence": confidence, "significant": bool(low > 0 or high < 0),
    }
    if set(np.unique(np.concatenate([b, c]))) <= {0.0, 1.0}:
        out["mcnemar_p"] = mcnemar_p(b, c)
    return out


def mcnemar_p(baseline: np.ndarray, cell: np.ndarray) -> float:
    """Exact McNemar p-value: only pairs where the two disagree carry information."""
    from statsmodels.stats.contingency_tables import mcnemar

    b, c = baseline.astype(bool), cell.astype(bool)
    table = [[int(np.sum(b & c)), int(np.sum(b & ~c))], [int(np.sum(~b & c)), int(np.sum(~b & ~c))]]
    return float(mcnemar(table, exact=True).pvalue)


def divergence(baseline: list[list[int]], cell: list[list[int]]) -> AccuracyComparison:
    """How many greedy sequences equal the baseline's, and the earliest token position where any differs."""
    if len(baseline) != len(cell) or not cell:
        raise ValueError(f"need the same, non-zero number of sequences (baseline {len(baseline)}, cell {len(cell)})")
    firsts = [_first_difference(x, y) for x, y in zip(baseline, cell, strict=True)]
    differing = [f for f in firsts if f is not None]
    return {
        "sequences": len(cell),
        "identical_fraction": 1 - len(differing) / len(cell),
        "first_divergence": min(differing) if differing else None,
    }


def _first_difference(x: list[int], y: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(x, y, strict=False)):
        if a != b:
            return i
    return None if len(x) == len(y) else min(len(x), len(y))
