"""Records mean the same on every vLLM release: records captured from real runs of several releases (GPU and CPU,
tests/fixtures/records/<machine>-vllm-<version>/), judged by the current cases, find every field their
expectations name. A rename between releases (FlashInfer's `q_data_type` split into prefill and decode in 0.25)
must show as the current name on every release, never as "no q_data_type_prefill recorded"."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from packaging.version import Version

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.record.neighbours import Neighbours
from kvmatrix.harness.record.task import Task
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import load_cases, load_models, load_pool
from tests.conftest import FIXTURES

POOL = load_pool()
CELLS = {c.cell_id: c for c in expand_all(load_cases(), load_models(), POOL)}
FOLDERS = sorted(p for p in (FIXTURES / "records").iterdir() if p.is_dir())
# A whole judged record names its cell and class; the oldest CPU captures are bare cell results (test_verdict.py).
JUDGED = [p for folder in FOLDERS for p in sorted(folder.glob("*.json"))
          if {"gpu_class", "cell_id"} <= json.loads(p.read_text()).keys()]
MISSING_FIELD = re.compile(r"\bno [\w ]+ recorded\b|no KV-cache group holds|no attention group holds")


def release_of(folder: Path) -> tuple[str, str]:
    machine, version = folder.name.split("-vllm-")
    return machine, version


def test_fixtures_cover_three_releases_on_gpu_and_on_cpu():
    releases: dict[str, set[str]] = {}
    for folder in FOLDERS:
        machine, version = release_of(folder)
        releases.setdefault(machine, set()).add(version)
    assert len(releases.get("h200", ())) >= 3 and len(releases.get("cpu", ())) >= 3, releases


@pytest.mark.parametrize("path", JUDGED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_field_an_expectation_names_is_recorded(path, tmp_path):
    record = json.loads(path.read_text())
    assert record["vllm_version"] == release_of(path.parent)[1]
    cell = CELLS.get(record["cell_id"])
    if cell is None or record.get("status") == "skipped":
        pytest.skip(f"{record['cell_id']}: no longer a cell of the default cases, or not run")
    task = Task(cell, record["gpu_class"], POOL[record["gpu_class"]], record.get("emulated_from"))
    judged = judge_record(record, task, Neighbours())
    missing = [r for r in judged["expectations"] if MISSING_FIELD.search(r["detail"])]
    assert not missing, missing


def test_flashinfer_query_dtype_reads_alike_before_and_after_the_split():
    """0.25 split FlashInfer's one `q_data_type` into prefill and decode: older records get both names."""
    seen = {}
    for path in JUDGED:
        record = json.loads(path.read_text())
        if not record["cell_id"].startswith("flashinfer-qdtype[kv=fp8,skip=-") or record["gpu_class"] != "H200":
            continue
        task = Task(CELLS[record["cell_id"]], "H200", POOL["H200"], None)
        judged = judge_record(record, task, Neighbours())
        builders = [g["builder"] for g in judged["attn_groups"] if g.get("backend") == "FLASHINFER"]
        if builders:
            seen[record["vllm_version"]] = {k: builders[0].get(k) for k in ("q_data_type_prefill", "q_data_type")}
    old = [v for v in seen if Version(v) < Version("0.25")]
    assert old and any(Version(v) >= Version("0.25") for v in seen), seen
    for version in old:
        assert seen[version]["q_data_type_prefill"] == seen[version]["q_data_type"] is not None, seen
