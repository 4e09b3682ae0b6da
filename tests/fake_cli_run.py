"""`kvmatrix run` over the fake cells (tests/fake_cell.py, fake_worker.py), as its own process so that tests can
signal it: fake_cli_run.py CASES_DIR WORK [kvmatrix run arguments...]. Its runs and cache folders are under WORK;
the command is the production one (`kvmatrix.harness.cli.main`), only the cells are stand-ins.
FAKE_TEMPLATES=1: processes are forked from the fake template (tests/fake_template.py), as a CPU run forks them."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

from kvmatrix.harness import cli
from kvmatrix.harness.run import plan as run_plan
from tests.conftest import CPU_CLASS
from tests.fault_run import FAKE_CELL, FAKE_TEMPLATE, FAKE_WORKER
from tests.test_front_ends import fake_sessions


def main() -> int:
    # A harness started by an xdist worker inherits SIGINT ignored; the tests interrupt it as a terminal would.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cases_dir, work = Path(sys.argv[1]), Path(sys.argv[2])
    fake = fake_sessions(run_plan.open_session, cases_dir, work)
    templates = os.environ.get("FAKE_TEMPLATES") == "1"
    if templates:  # the run takes the fake commands for its own: it forks them from its (fake) template
        run_plan.CELL_COMMAND, run_plan.WORKER_COMMAND = FAKE_CELL, FAKE_WORKER

    def session(*args, **kwargs):
        opened = fake(*args, **kwargs)
        if templates:
            opened.settings = replace(opened.settings, template_command=FAKE_TEMPLATE)
        return opened

    run_plan.open_session = session
    return cli.main(["run", "--runs-dir", str(work / "runs"), "--cache-dir", str(work / "cache"), "--gpu", CPU_CLASS,
                     "--db", str(work / "none.sqlite"), "--cases-dir", str(cases_dir), *sys.argv[3:]])


if __name__ == "__main__":
    sys.exit(main())
