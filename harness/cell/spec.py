"""What the runner tells a cell process (SPEC.json): the one typed contract between the two sides. The runner
writes it (harness/run/task/runner.py), the cell process reads it (main.py); the JSON keeps its plain shape, so
stand-ins (tests/fake_cell.py, benchmarks/bare_cell.py) read it as a dict."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmatrix.harness.record.files import write_json_atomic


@dataclass(frozen=True)
class AccuracySpec:
    """An lm-eval run through the cell's own engine (harness/cell/lm_eval_engine.py)."""

    task: str
    metric: str
    limit: int | None = None
    num_fewshot: int | None = None
    include_path: str | None = None
    include_defaults: bool = True  # lm-eval's built-in task files (seconds to index): only built-in tasks
    offline: bool = True


@dataclass(frozen=True)
class CellSpec:
    cell_id: str
    engine_args: dict[str, Any]
    prompts: list[str]
    max_tokens: int
    emulate_capability: list[int] | None = None  # [major, minor] of the emulated CUDA class
    emulate_cpu_isa: str | None = None  # the emulated CPU level (avx2, ...)
    accuracy: AccuracySpec | None = None
    # The workload's parameters (harness/cell/workloads.py; None: the plain generation of `prompts`), the workloads
    # whose prompts an oracle generates plainly after its own, and how many top logprobs each position records
    # (cells of a differential pair only).
    workload: dict[str, Any] | None = None
    references: list[dict[str, Any] | None] = field(default_factory=list)
    logprobs: int | None = None
    # Teacher-forced decodes (harness/cell/forced.py): a compared cell's oracle's greedy tokens for its prompts (or
    # its workload's requests) and that oracle's id; its model reference's greedy tokens and that reference's id
    # (no tokens where the reference is its oracle: the one decode serves both); an oracle or a reference measures
    # its noise floor; the forcing method (harness/vllm_compat/forcing.py) for this vLLM and device.
    forced_tokens: list[list[int]] | None = None
    forced_of: str | None = None
    reference_tokens: list[list[int]] | None = None
    reference_of: str | None = None
    noise_floor: bool = False
    forcing: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys of a newer runner this cell does not know

    def write(self, path: Path) -> None:
        data = dataclasses.asdict(self)
        data.update(data.pop("extra"))
        write_json_atomic(path, data)

    @classmethod
    def read(cls, path: Path) -> CellSpec:
        data = json.loads(Path(path).read_text())
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        if known.get("accuracy") is not None:
            known["accuracy"] = AccuracySpec(**known["accuracy"])
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})
