"""A case's combinations of axis values: the cross product of its matrix, minus `exclude:`, plus `extra:` (a CI
matrix's include), each a dict of every axis; their count, capped before anything expands; a combination as a key."""

from __future__ import annotations

import itertools
import math
from typing import Any

from kvmatrix.matrix.axes import AXES, DRAFT_AXES
from kvmatrix.matrix.case import Case
from kvmatrix.matrix.conditions import matches
from kvmatrix.matrix.schema import CaseError


def case_values(case: Case, axis: str) -> list[Any]:
    """Every value the case gives an axis: its matrix's, then each `extra:` point's (an unset one its default)."""
    return list(getattr(case.matrix, axis)) + [getattr(point, axis) for point in case.matrix.extra]


# Cells a run expands to at most (`--max-cells` sets another cap, 0 none): a 10^6-cell matrix took 114 s and
# 2.3 GB to plan, then started a cell a second, skips included.
MAX_CELLS = 20_000


def matrix_size(case: Case) -> int:
    """The cells a case's matrix can expand to, counted without expanding it: its cross product and extra points
    (excludes only remove cells; the oracles a differential rule adds at most double them)."""
    m = case.matrix
    return math.prod(len(getattr(m, a)) for a in AXES) + len(m.extra)


def check_size(case: Case, source: str, max_cells: int | None) -> None:
    """CaseError where the case's matrix may expand to more than `max_cells` cells (None: no cap)."""
    if max_cells is not None and (size := matrix_size(case)) > max_cells:
        raise CaseError(source, case.name, "matrix", f"expands to up to {size:,} cells, over the {max_cells:,} "
                                                     "this run may still take (`--max-cells N` sets the cap, 0 none)")


def combo_key(combo: dict[str, Any], axes: tuple[str, ...] = AXES) -> tuple:
    """A combination as a dict key (a skip list is a list)."""
    return tuple(tuple(combo[a]) if isinstance(combo[a], list) else combo[a] for a in axes)


def cross_product(case: Case) -> list[dict[str, Any]]:
    """Every combination of the values the case's matrix gives each axis (before `exclude:` and `extra:`)."""
    return [dict(zip(AXES, values, strict=True))
            for values in itertools.product(*(getattr(case.matrix, a) for a in AXES))]


def combinations(case: Case) -> list[dict[str, Any]]:
    m = case.matrix
    kept = [
        combo for combo in cross_product(case)
        if not any(all(matches(v, combo[k]) for k, v in ex.given().items()) for ex in m.exclude)
        and (combo["speculative"] or not any(combo[a] for a in DRAFT_AXES))  # draft options need a draft
    ]
    seen = {combo_key(combo) for combo in kept}
    for point in m.extra:
        combo = point.model_dump()
        if combo_key(combo) not in seen:
            seen.add(combo_key(combo))
            kept.append(combo)
    return kept
