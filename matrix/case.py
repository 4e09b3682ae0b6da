"""One case file: a model crossed with the matrix's axes on the pool's classes, what each cell generates, the
engine arguments and environment it adds, and its skip rules, expectations, accuracy block and differential rule."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from kvmatrix.matrix.axes import MatrixAxes
from kvmatrix.matrix.conditions import check_condition_value
from kvmatrix.matrix.expectations import Accuracy, Differential, Expectation, SkipRule
from kvmatrix.matrix.schema import Strict

# Bounds on what a case may ask of a run: a day for one cell (a bigger finite number overflowed the timer and lost
# the run), and a few tries more for a flaky one (a million kept the run, and every record after it, waiting).
MAX_TIMEOUT_S = 24 * 3600.0
MAX_RETRIES = 5


class Generation(Strict):
    prompts: list[str] = Field(default_factory=lambda: ["The capital of France is", "1 2 3 4 5"], min_length=1)
    max_tokens: int = Field(default=8, ge=1)
    # Where the model has learned a task: each prompt's answer, the first line its continuation must be. A
    # differential cell's answers are then scored and paired with its oracle's (harness/judge/answers.py).
    answers: list[str] | None = None

    @model_validator(mode="after")
    def _one_answer_per_prompt(self) -> Generation:
        if self.answers is not None and len(self.answers) != len(self.prompts):
            raise ValueError(f"answers: {len(self.answers)} answers for {len(self.prompts)} prompts")
        return self


class Case(Strict):
    name: str
    description: str = ""
    # Free labels for grouping cells in reports, e.g. the regression class a case covers (`class-7`).
    tags: list[str] = Field(default_factory=list)
    model: str
    gpus: list[str | dict[str, Any]] = Field(default=["*"])  # pydantic copies it
    matrix: MatrixAxes = Field(default_factory=MatrixAxes)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    # More fields of every draft cell's `speculative_config` (over the registry draft entry's own `config`), e.g.
    # `{parallel_drafting: true}`; the draft axes win over them. A release without one of them skips the cell.
    speculative_config: dict[str, Any] = Field(default_factory=dict)
    # Environment for the cell process: only variables the installed vLLM reads (checked at load), never
    # PATH, LD_PRELOAD or the harness's own.
    env: dict[str, str] = Field(default_factory=dict)
    generate: Generation = Field(default_factory=Generation)
    timeout_s: float = Field(default=600, gt=0, le=MAX_TIMEOUT_S)
    retries: int = Field(default=0, ge=0, le=MAX_RETRIES)
    skip: list[SkipRule] = Field(default_factory=list)
    expect: list[Expectation] = Field(default_factory=list)
    accuracy: Accuracy | None = None
    # Cells compared with the same configuration run eager and plain (`false`: none).
    differential: Literal[False] | Differential = Field(default_factory=Differential)

    @field_validator("gpus")
    @classmethod
    def _check_gpus(cls, value: list) -> list:
        for cond in value:
            if isinstance(cond, dict):
                for sub in cond.values():
                    if problem := check_condition_value(sub):
                        raise ValueError(problem)
        return value
