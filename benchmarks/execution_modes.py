"""What an execution mode costs: each selected cell run eager and in another mode (`compiled` on a CPU class, vLLM's
default `graphs` on a GPU one, or `--mode`), side by side in one invocation, cold then warm, one fresh process per
cell (`--isolation process`: a cell's own imports, engine start, compilation or capture, generation and teardown).

    python benchmarks/execution_modes.py [-k PATTERN] [--mode compiled|graphs|...] [--gpu CLASS [--emulate]]

Cold: one empty cache folder for the whole invocation, as on a fresh CI machine; the pairs alternate which mode goes
first. Warm: the same cells again on that cache (vLLM's torch.compile cache, inductor's, triton's: what the first
round compiled), as a nightly on a kept machine runs them. Prints each cell's seconds per mode and the ratio
mode/eager per round; the goal for a graphs cell is at most 2x its eager cell warm.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvmatrix.harness.cli.selection import load_cells
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.paths import PACKAGE_ROOT
from kvmatrix.harness.run.cases import cell_selected
from kvmatrix.harness.run.executor.local import run_locally
from kvmatrix.harness.run.session import open_session
from kvmatrix.matrix.axes import DEFAULT_EXECUTION, resolved_execution

WARM_UP = "import torch, vllm; torch.cuda.init() if torch.cuda.is_available() else None"
DEFAULT_PATTERN = "execution-modes[kv=*,exec=default,wl=plain*"  # no closing bracket: a glob, not a class


def as_mode(cell, execution: str):
    """The cell with its execution set (a distinct id, so that both runs keep their records)."""
    axes = {**cell.axes, "execution": execution}
    return dataclasses.replace(cell, cell_id=f"{cell.cell_id}@{execution}", axes=axes, oracles=(), references=())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", default=DEFAULT_PATTERN, help=f"cells (substring or glob; default {DEFAULT_PATTERN})")
    parser.add_argument("--mode", help="the execution compared with eager (default: compiled on a CPU class, "
                                       "graphs on a GPU class)")
    parser.add_argument("--gpu")
    parser.add_argument("--emulate", action="store_true")
    parser.add_argument("--cache-dir", default=".cache", help="where the built models are")
    args = parser.parse_args()
    _, _, every = load_cells(argparse.Namespace(cases_dir=str(PACKAGE_ROOT / "cases"), case=None, k=None, cell=None))
    cells = [c for c in every if cell_selected(c.cell_id, args.k)]
    if not cells:
        parser.error(f"no cell matches {args.k!r}")
    scratch = Path(tempfile.mkdtemp(prefix="kvm-exec-bench-"))
    session = open_session(gpu=args.gpu, emulate=args.emulate, run_id="bench", runs_dir=scratch / "runs",
                           cache_dir=scratch / "cache")
    device = session.gpu.device or "cuda"
    mode = args.mode or ("compiled" if device == "cpu" else DEFAULT_EXECUTION["cuda"])
    pairs = [(as_mode(c, "eager"), as_mode(c, mode)) for c in cells
             if resolved_execution(c.axes["execution"], device) in ("eager", mode)]
    builder = open_session(gpu=args.gpu, emulate=args.emulate, run_id="build", runs_dir=scratch / "runs",
                           cache_dir=Path(args.cache_dir).resolve())
    builder.build_models(session.tasks([c for pair in pairs for c in pair]))
    session.settings = dataclasses.replace(session.settings, built=builder.settings.built, isolation="process")
    subprocess.run([sys.executable, "-c", WARM_UP], check=True, cwd=PACKAGE_ROOT)
    print(f"{len(pairs)} cells on {session.gpu_name}, eager vs {mode}, one fresh process per cell", flush=True)
    for round_name in ("cold", "warm"):
        for i, (eager, other) in enumerate(pairs):
            order = [eager, other] if i % 2 == 0 else [other, eager]
            seconds = {}
            for cell in order:
                fresh = dataclasses.replace(session.settings, run_dir=RunDir(scratch / "runs" / f"{round_name}-{i}"))
                started = time.monotonic()
                (record,) = run_locally(session.tasks([cell]), fresh, jobs=1)
                seconds[cell.axes["execution"]] = (time.monotonic() - started, record["verdict"])
            (e, ev), (m, mv) = seconds["eager"], seconds[mode]
            print(f"{round_name}  {eager.cell_id.split('@')[0]:60s} eager {e:6.1f} s ({ev})  {mode} {m:6.1f} s "
                  f"({mv})  {mode}/eager {m / e:.2f}x", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} cores")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
