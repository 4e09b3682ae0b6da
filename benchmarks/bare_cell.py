"""The baseline for harness_overhead.py: the same engine arguments started in-process with nothing around them.

    python benchmarks/bare_cell.py SPEC.json TIMINGS.json
    (SPEC: {"engine_args": ..., "prompts": ..., "max_tokens": ...}; TIMINGS gets import_s, init_s, generate_s)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    timings = {}
    started = time.monotonic()
    # torch first, as the cell process does: the comparison is about the harness, not import order.
    import torch  # noqa: F401
    import vllm

    timings["import_s"], started = time.monotonic() - started, time.monotonic()
    llm = vllm.LLM(**spec["engine_args"])
    timings["init_s"], started = time.monotonic() - started, time.monotonic()
    # As the cell generates: greedy, exactly max_tokens.
    params = vllm.SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True)
    llm.generate(spec["prompts"], params, use_tqdm=False)
    timings["generate_s"] = time.monotonic() - started
    Path(sys.argv[2]).write_text(json.dumps(timings))
    sys.stdout.flush()
    os._exit(0)  # as the cell does: vLLM's teardown is not part of either side's cost
