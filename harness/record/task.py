"""The task model: one cell of the matrix on one GPU class. What the executors run, the judge judges and
the start order orders; the record it ends in is filed under `key`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvmatrix.harness.record.files import record_stem
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.schema import GpuClass


@dataclass(frozen=True)
class Task:
    """One cell on one GPU class (the class it reports as; `emulated_from` is the real one when emulating)."""

    cell: Cell
    gpu_name: str
    gpu: GpuClass
    emulated_from: str | None = None

    @property
    def key(self) -> str:
        return record_stem(self.cell.cell_id, self.gpu_name)

    def context(self, vllm_version: str | None) -> dict[str, Any]:
        """What `when:` clauses see for this task under that vLLM version."""
        return self.cell.context(self.gpu_name, self.gpu, vllm_version, self.emulated_from is not None)
