"""A cell: one configuration of a case (its axes) on the GPU classes it applies to, with the cells it is compared
with there (its accuracy baseline, differential oracle, model reference, speculative twins: matrix/compared.py
decides which) and what `when:` clauses see of it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvmatrix.matrix.axes import RANK_AXES, Axes, resolved_execution
from kvmatrix.matrix.case import Case
from kvmatrix.matrix.conditions import when_matches
from kvmatrix.matrix.schema import GpuClass


@dataclass(frozen=True)
class Cell:
    cell_id: str
    case: Case
    axes: Axes
    gpu_classes: tuple[str, ...]
    source: str = field(default="", compare=False)
    baseline_id: str | None = None  # the cell whose accuracy this one is compared with (accuracy cases only)
    # The differential rule (matrix/expectations.py Differential), per GPU class: the cell this one is compared with
    # there, and the workloads whose prompts this cell generates plainly there as the oracle of such cells.
    oracles: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    references: tuple[tuple[str, tuple[str, ...]], ...] = field(default=(), compare=False)
    # Speculative decoding's two oracles (harness/judge/speculative.py): a draft cell's no-draft twin (the same
    # axes without the draft: greedy outputs must agree), and per GPU class its plain twin (the same draft, auto
    # KV, no draft options, no forced backend, eager and plain there: the acceptance it must not collapse from).
    # `twin_of_draft`: this cell is some draft cell's no-draft twin (it records logprobs for the comparison).
    draft_twin: str | None = field(default=None, compare=False)
    plain_twins: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    twin_of_draft: bool = field(default=False, compare=False)
    # Per GPU class, the case's model reference there (reference_axes: an unquantized cache, eager, plain), which
    # every other plain cell of the case is compared with (harness/judge/reference.py).
    model_references: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    reference_for: tuple[str, ...] = field(default=(), compare=False)  # the classes where it is the reference
    # A configuration kvmatrix adds as the model reference (or its eager oracle), which the case's matrix does not
    # list: the case's rules were written for its own cells (an fp8-only case's `layers: {kv_cache_dtype: fp8}`),
    # so such a cell is held only to starting and generating (harness/judge/judge.py `rules_of`).
    added_reference: bool = field(default=False, compare=False)

    @property
    def model(self) -> str:
        return self.case.model

    @property
    def gpus_needed(self) -> int:
        """GPUs of its class one engine of this cell spans (tensor x pipeline parallel ranks)."""
        return math.prod(self.axes[axis] for axis in RANK_AXES)

    def oracle_on(self, gpu_name: str) -> str | None:
        """The oracle this cell is compared with on that class (None: it is compared with none there)."""
        return dict(self.oracles).get(gpu_name)

    def references_on(self, gpu_name: str) -> tuple[str, ...]:
        """The workloads whose prompts this cell generates plainly on that class, as their cells' oracle."""
        return dict(self.references).get(gpu_name, ())

    def is_oracle_on(self, gpu_name: str) -> bool:
        return gpu_name in dict(self.references)

    def plain_twin_on(self, gpu_name: str) -> str | None:
        """The draft cell whose acceptance this one's is compared with on that class (None: none there)."""
        return dict(self.plain_twins).get(gpu_name)

    def reference_on(self, gpu_name: str) -> str | None:
        """The model reference this cell is compared with on that class (None: none there, or it is the one)."""
        return dict(self.model_references).get(gpu_name)

    def is_reference_on(self, gpu_name: str) -> bool:
        return gpu_name in self.reference_for

    def compared_with(self, gpu_name: str) -> set[str]:
        """Every cell this one is compared with on that class, which must run before it: its differential oracle,
        its model reference and its speculative twins (the accuracy baseline apart)."""
        return {c for c in (self.oracle_on(gpu_name), self.reference_on(gpu_name), self.draft_twin,
                            self.plain_twin_on(gpu_name)) if c}

    def context(self, gpu_name: str, gpu: GpuClass, vllm_version: str | None, emulated: bool) -> dict:
        """What `when:` clauses see for this cell on one GPU class (its execution as it runs on that class)."""
        return {
            **self.axes,
            "execution": resolved_execution(self.axes["execution"], gpu.device),
            "model": self.case.model,
            "gpu": {"name": gpu_name, **gpu.model_dump()},
            "vllm_version": vllm_version,
            "emulated": emulated,
        }

    def skip_reason(self, context: dict) -> str | None:
        for rule in self.case.skip:
            if when_matches(rule.when, context):
                return rule.reason
        return None
