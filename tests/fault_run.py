"""Runs a matrix of misbehaving fake cells through the real harness (`run_locally`), as its own process so that
tests can interrupt or kill the harness itself. Usage: fault_run.py CASES_DIR RUN_DIR [JOBS [ISOLATION [template]]]
(`template`: processes forked from the fake template, tests/fake_template.py)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.executor.local import run_locally
from kvmatrix.harness.run.session import Session
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import load_cases, load_models, load_pool

FAKE_CELL = (sys.executable, str(Path(__file__).with_name("fake_cell.py")))
FAKE_WORKER = (sys.executable, str(Path(__file__).with_name("fake_worker.py")))
FAKE_TEMPLATE = (sys.executable, str(Path(__file__).with_name("fake_template.py")))


def main() -> None:
    # A harness started by an xdist worker inherits SIGINT ignored; the tests interrupt it as a terminal would.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cases_dir, run_root = Path(sys.argv[1]), Path(sys.argv[2])
    jobs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    isolation = sys.argv[4] if len(sys.argv) > 4 else "process"
    forked = len(sys.argv) > 5 and sys.argv[5] == "template"
    pool, models = load_pool(cases_dir), load_models(cases_dir)
    cells = expand_all(load_cases(sorted(p for p in cases_dir.glob("[!_]*.yaml"))), models, pool)
    settings = RunSettings(run_dir=RunDir(run_root), models=models, built={"llama": cases_dir},
                           vllm_version="fake", cache_dir=run_root.parent / "cache", cell_command=FAKE_CELL,
                           isolation=isolation, worker_command=FAKE_WORKER, fork_from_template=forked,
                           template_command=FAKE_TEMPLATE)
    # Fake cells run no vLLM: any CPU class is a label here (the tests' cases name this one).
    session = Session(settings, "cpu-avx512", pool["cpu-avx512"], None, pool)

    def show(record, done, total, resumed):
        print(f"[{done}/{total}] {record['verdict']} {record['cell_id']} {'resumed' if resumed else ''}", flush=True)

    run_locally(session.tasks(cells), settings, jobs=jobs, on_record=show)


if __name__ == "__main__":
    main()
