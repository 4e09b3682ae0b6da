"""The axis table (matrix/axes.py): each axis declared once, and what is made from it (the case file's schema, an
`extra:` point's defaults, cell ids, engine arguments, the grid's rows and columns) covering every axis; an axis an
`extra:` point leaves unset takes its default, so it runs as the case's other cells do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.task.spec import ENGINE_ROUTES, engine_args_for
from kvmatrix.matrix.axes import AXES, AXIS_DEFAULTS, AXIS_TABLE, ExcludeRule, ExtraPoint, MatrixAxes
from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.load import load_case, load_models, load_pool
from kvmatrix.reports.html_grid import COLUMN_AXES, ROW_AXES
from tests.conftest import CPU_CLASS, write_case

REPO = Path(__file__).resolve().parent.parent


def test_every_axis_is_one_entry_of_the_table():
    assert len(set(AXES)) == len(AXES) and len({a.id_key for a in AXIS_TABLE}) == len(AXIS_TABLE)
    assert list(MatrixAxes.model_fields) == [*AXES, "extra", "exclude"]
    assert list(ExtraPoint.model_fields) == list(ExcludeRule.model_fields) == list(AXES)
    assert ExtraPoint().model_dump() == AXIS_DEFAULTS and ExcludeRule().given() == {}
    assert {a.engine for a in AXIS_TABLE} <= set(ENGINE_ROUTES)
    assert {a.name for a in ROW_AXES + COLUMN_AXES} == set(AXES)


# A case that leaves `workload` unset everywhere, with an extra point: before the extra point's unset workload was
# read as None, "not plain", so every cell of the case got the workloads' 512-token context, which the trained
# Llama (256 positions) refuses at start.
EXTRA_POINT_CASE = {
    "model": "trained-llama",
    "gpus": [{"device": "cpu"}],
    "matrix": {"kv_cache_dtype": ["auto"], "extra": [{"kv_cache_dtype": "bfloat16"}]},
    "generate": {"prompts": ["48213=", "1234567="], "answers": ["31284", "7654321"], "max_tokens": 8},
    "expect": [{"crash": False}],
}


def test_an_extra_point_leaves_unset_axes_at_their_defaults(cases_dir):
    path = write_case(cases_dir, "extra", EXTRA_POINT_CASE)
    pool, models = load_pool(cases_dir), load_models(cases_dir)
    cells = expand_case(load_case(path), models, pool, str(path))
    assert [c.cell_id for c in cells] == ["extra[kv=auto,skip=-,spec=-]", "extra[kv=bfloat16,skip=-,spec=-]"]
    assert all(c.axes["workload"] == "plain" and c.axes["execution"] == "default" for c in cells)
    for cell in cells:
        args = engine_args_for(cell, pool[CPU_CLASS], models, {"trained-llama": Path("/m")}, vllm_version="0.32.0")
        assert args["max_model_len"] == 256, cell.cell_id


@pytest.mark.vllm
@pytest.mark.trained_models
def test_a_case_with_an_extra_point_and_no_workload_runs_on_the_trained_llama(tmp_path, cases_dir):
    write_case(cases_dir, "extra", EXTRA_POINT_CASE)
    done = subprocess.run(
        [sys.executable, "-m", "kvmatrix", "run", "--cases-dir", str(cases_dir), "--runs-dir", str(tmp_path / "runs"),
         "--cache-dir", str(REPO / ".cache"), "--db", str(tmp_path / "none.sqlite"), "--run-id", "extra",
         "--jobs", "1"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = {r["axes"]["kv_cache_dtype"]: r for r in RunDir(tmp_path / "runs" / "extra").records()}
    assert {kv: r["verdict"] for kv, r in records.items()} == {"auto": "pass", "bfloat16": "pass"}
    assert {r["engine_args"]["max_model_len"] for r in records.values()} == {256}
    assert records["bfloat16"]["axes"]["workload"] == "plain"
