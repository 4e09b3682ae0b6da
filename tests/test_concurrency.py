"""Concurrent writers: many cells finishing at once in several harness processes (as xdist workers do) into one
run folder, and several processes importing into one history database: no torn, lost or duplicated records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.results import history
from tests.conftest import write_case

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_CELL_SLEEP": "0"}


def test_many_cells_from_several_harnesses_into_one_run_folder_and_history(cases_dir, tmp_path):
    write_case(cases_dir, "ok", {"model": "llama", "gpus": ["cpu-avx512"], "matrix": {
        "kv_cache_dtype": ["auto", "bfloat16", "fp8", "fp8_e5m2", "float16"],
        "kv_cache_dtype_skip_layers": [[], ["0"], ["1"], ["2"], ["3"], ["0", "3"]]}})
    run = tmp_path / "run"
    harnesses = [subprocess.Popen([sys.executable, str(REPO / "tests" / "fault_run.py"), str(cases_dir), str(run), "8"],
                                  env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for _ in range(3)]
    for h in harnesses:
        assert h.wait(timeout=300) == 0, h.stderr.read()
    files = sorted(p for p in run.glob("*.json") if p.name != "run.json")
    assert len(files) == 30 and not list(run.glob(".tmp-*"))
    assert all(json.loads(p.read_text())["verdict"] == "pass" for p in files)

    db_path = tmp_path / "history.sqlite"
    importer = ("import sys; from pathlib import Path; from kvmatrix.harness.results import history; "
                "history.import_run(history.open_db(sys.argv[1]), Path(sys.argv[2]))")
    importers = [subprocess.Popen([sys.executable, "-c", importer, str(db_path), str(run)], env=ENV,
                                  stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for i in importers:
        assert i.wait(timeout=300) == 0, i.stderr.read()
    db = history.open_db(db_path)
    assert len(history.records_of(db, "run", "cpu-avx512")) == 30
    assert sorted(r["cell_id"] for r in history.records_of(db, "run")) == sorted(
        r["cell_id"] for r in RunDir(run).records())
