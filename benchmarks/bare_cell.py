"""The baseline the harness is measured against: engines started in-process with nothing around them.

    python benchmarks/bare_cell.py SPEC.json TIMINGS.json
    SPEC: {"engine_args": ..., "prompts": ..., "max_tokens": ...}: one cell (harness_overhead.py); TIMINGS gets
          import_s, init_s, generate_s.
    SPEC: {"cells": [{"cell_id", "engine_args", "prompts", "max_tokens", "accuracy"?}, ...]}: the warm-process
          floor (warm_workers.py): every cell one after another in this one process, each engine torn down as a
          warm worker tears it down; TIMINGS gets import_s and, per cell, its wall (start, generate, accuracy,
          teardown). A cell whose engine refuses to start costs the time until the refusal.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path


def one_cell(vllm, cell: dict) -> dict:
    timings, started = {}, time.monotonic()
    try:
        llm = vllm.LLM(**cell["engine_args"])
        timings["init_s"], started = time.monotonic() - started, time.monotonic()
        # As the cell generates: greedy, exactly max_tokens.
        params = vllm.SamplingParams(temperature=0.0, max_tokens=cell["max_tokens"], ignore_eos=True)
        llm.generate(cell["prompts"], params, use_tqdm=False)
        timings["generate_s"] = time.monotonic() - started
        if cell.get("accuracy"):
            from kvmatrix.harness.cell.lm_eval_engine import evaluate

            evaluate(llm, cell["accuracy"])
    except Exception as exc:  # a refusal the case expects: the floor still pays for it
        timings["refused"] = type(exc).__name__
    return timings


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    timings: dict = {}
    started = time.monotonic()
    # torch first, as the cell process does: the comparison is about the harness, not import order.
    import torch  # noqa: F401
    import vllm

    timings["import_s"] = time.monotonic() - started
    if "cells" not in spec:
        timings.update(one_cell(vllm, spec))
    else:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        timings["cells"] = {}
        for cell in spec["cells"]:
            started = time.monotonic()
            timings["cells"][cell["cell_id"]] = one_cell(vllm, cell)
            cleanup_dist_env_and_memory()
            gc.collect()
            timings["cells"][cell["cell_id"]]["wall_s"] = time.monotonic() - started
    Path(sys.argv[2]).write_text(json.dumps(timings))
