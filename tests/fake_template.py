"""A stand-in for `python -m kvmatrix.harness.cell.template_server`: the production template loop (`run_template`)
forking the misbehaving fake cells (tests/fake_cell.py) and fake workers (tests/fake_worker.py) instead of real ones.
Its "imports" are chosen by FAKE_TEMPLATE: "broken" fails them as a broken environment would (the fake cells then
record the same import error, tests/fake_cell.py), "thread" leaves a second Python thread alive (unsafe to fork),
"slow" takes two minutes to import."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from kvmatrix.harness.cell.template_server import run_template
from tests.fake_cell import broken_environment, run
from tests.fake_worker import serve_fake_cells


def prepare(emulation: dict[str, Any]) -> None:
    broken_environment()
    if os.environ.get("FAKE_TEMPLATE") == "slow":  # imports as slow as a busy machine's
        time.sleep(120)
    if os.environ.get("FAKE_TEMPLATE") == "thread":
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()


if __name__ == "__main__":
    run_template(prepare, run, serve_fake_cells)
