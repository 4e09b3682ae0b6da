"""Judging a stored record again is judging it: `kvmatrix rejudge` builds the whole judged record again from the
record's outcome (record/types.py `outcome_of`), keeping nothing an earlier judgement added, so every fixture run
judged again is byte for byte what a fresh judgement of its outcomes gives (here the runs of tests/fixtures/runs/
and the folders of tests/fixtures/records/ that hold judged records, under the shipped case files)."""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

import pytest

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.outcome import reclassified
from kvmatrix.harness.record.files import RunDir, json_text
from kvmatrix.harness.record.neighbours import Neighbours, neighbours_of
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import outcome_of
from kvmatrix.harness.run.rejudge import rejudge_run
from tests.conftest import FIXTURES, shipped_matrix, unpacked_archive

TODAY = datetime.date(2026, 12, 5)
ARCHIVES = sorted((FIXTURES / "runs").glob("*.tar.xz"))
RECORD_FOLDERS = sorted(p for p in (FIXTURES / "records").iterdir()
                        if any('"verdict"' in f.read_text() for f in p.glob("*--*.json")))


def run_folders(root: Path) -> list[Path]:
    """Every folder under `root` that holds record files (`<class>--<cell id>.json`)."""
    return sorted({path.parent for path in root.rglob("*--*.json")})


def fresh_judgements(run_dir: RunDir) -> dict[str, str]:
    """{record file name: its text} of each judged record of the folder judged afresh from its outcome, against
    its neighbours as the folder holds them."""
    pool, cells, waivers = shipped_matrix()
    out = {}
    for record in run_dir.records():
        cell, gpu = cells.get(record["cell_id"]), record.get("gpu_class", "")
        if cell is None or gpu not in pool or record.get("status") == "skipped":
            continue
        task = Task(cell, gpu, pool[gpu], record.get("emulated_from"))
        outcome = reclassified(outcome_of(record), run_dir.log_tail(record))
        judged = judge_record(outcome, task, neighbours_of(task, run_dir), waivers, today=TODAY)
        out[run_dir.record_path(record["cell_id"], gpu).name] = json_text(judged)
    return out


def rejudged_equals_fresh(folder: Path, scratch: Path) -> list[str]:
    """The record files whose `kvmatrix rejudge` differs from a fresh judgement of their outcomes. Judged again
    twice first, so that every neighbour is as judgement leaves it (a fixed point)."""
    pool, cells, waivers = shipped_matrix()
    run_dir = RunDir(scratch / folder.name)
    shutil.copytree(folder, run_dir.root)
    for _ in range(2):
        rejudge_run(run_dir, cells, pool, waivers, today=TODAY)
    return [name for name, text in fresh_judgements(run_dir).items() if (run_dir.root / name).read_text() != text]


@pytest.mark.parametrize("archive", ARCHIVES, ids=lambda p: p.name.split(".tar")[0])
def test_every_fixture_run_judged_again_is_a_fresh_judgement(archive, tmp_path_factory, tmp_path):
    root = unpacked_archive(tmp_path_factory, archive)
    folders = run_folders(root)
    assert folders, f"{archive.name} holds no record"
    for i, folder in enumerate(folders):
        differ = rejudged_equals_fresh(folder, tmp_path / str(i))
        assert not differ, f"{folder.relative_to(root)}: {len(differ)} records differ, first {differ[0]}"


@pytest.mark.parametrize("folder", RECORD_FOLDERS, ids=lambda p: p.name)
def test_every_fixture_record_folder_judged_again_is_a_fresh_judgement(folder, tmp_path):
    differ = rejudged_equals_fresh(folder, tmp_path)
    assert not differ, f"{len(differ)} records differ, first {differ[0]}"


def test_a_comparison_an_earlier_judgement_made_is_not_kept(tmp_path):
    """A record whose accuracy baseline is not in the folder any more: judged again, it says so; the comparison
    made when the baseline was there is gone, not kept beside the new judgement."""
    pool, cells, _ = shipped_matrix()
    cell = next(c for c in cells.values() if c.baseline_id not in (None, c.cell_id) and "cpu-amx" in c.gpu_classes)
    task = Task(cell, "cpu-amx", pool["cpu-amx"])
    stale = {"baseline": cell.baseline_id, "delta": -0.5, "p_value": 0.001}
    stored = {"cell_id": cell.cell_id, "case": cell.case.name, "model": cell.model, "axes": cell.axes,
              "gpu_class": "cpu-amx", "run_id": "r", "vllm_version": "0.32.0", "status": "crash", "signature": None,
              "error_tail": "RuntimeError: boom", "verdict": "fail", "reason": "accuracy dropped",
              "expectations": [], "tags": [], "accuracy_vs_baseline": stale}
    judged = judge_record(stored, task, Neighbours(), today=TODAY)
    assert judged.get("accuracy_vs_baseline") != stale
    assert judged == judge_record(outcome_of(stored), task, Neighbours(), today=TODAY)
