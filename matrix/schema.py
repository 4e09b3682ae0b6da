"""Strict schemas for kvmatrix's data files: what they all share, and the two shared files themselves.

Validation is strict (unknown keys, wrong types, unknown dtype names are errors) and every error names the file,
the case and the field (CaseError), so that a typo in a nightly case file is found before any engine starts.
pydantic does the type work. Here: the error, the strict base model, the installed vLLM's vocabulary, the model
registry (`_models.yaml`) and the GPU pool (`_pool.yaml`). A case file's schema is matrix/case.py, built from
its axes (axes.py) and what it expects of its cells' records (expectations.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvmatrix.matrix.messages import readable_problems


@dataclass(frozen=True)
class Vocabulary:
    """What the installed vLLM accepts, for checks no schema can make alone; an empty set is not checked
    (no vLLM installed)."""

    kv_cache_dtypes: frozenset[str] = frozenset()
    engine_args: frozenset[str] = frozenset()
    env_vars: frozenset[str] = frozenset()
    # The failure names a `crash:` / `refuse:` rule may use: the signatures and their families.
    signatures: frozenset[str] = frozenset()
    # The words a skip list may hold besides layer indices (vLLM ignores any other word silently).
    skip_layer_words: frozenset[str] = frozenset()
    # Registry model name -> the attention layers its local build brings (a draft's own, numbered after its
    # target's); a model missing here is not checked.
    model_layers: Mapping[str, int] = field(default_factory=dict)


class CaseError(ValueError):
    """A data file that cannot be used, with where the problem is."""

    def __init__(self, file: str, case: str | None, field: str | None, message: str):
        self.file, self.case, self.field, self.message = file, case, field, message
        where = [f"{file}"]
        if case:
            where.append(f"case '{case}'")
        if field:
            where.append(f"field '{field}'")
        super().__init__(f"{': '.join(where)}: {message}")


def validation_problems(err: ValidationError) -> list[tuple[str, str]]:
    """(dotted field, message) for each of pydantic's errors, in its order."""
    return [(".".join(str(p) for p in e["loc"] if p not in ("function-after", "function-before")), e["msg"])
            for e in err.errors()]


def _schema_models() -> dict[str, type[BaseModel]]:
    """Every model of the data files' schemas, by class name (how pydantic names a union's model members)."""
    found: dict[str, type[BaseModel]] = {}
    todo: list[type[BaseModel]] = [Strict]
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo += cls.__subclasses__()
    return found


def wrap_validation_error(err: ValidationError, file: str, case: str | None) -> CaseError:
    """The first pydantic error as a CaseError, worded for a person (matrix/messages.py: the field as the file spells
    it, the valid names where one is unknown); the rest follow in the message so none is hidden."""
    problems = readable_problems(err, _schema_models())
    field, message = problems[0]
    if len(problems) > 1:
        message += "; also: " + "; ".join(f"field '{f}': {m}" for f, m in problems[1:])
    return CaseError(file, case, field or None, message)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --- model registry and GPU pool --------------------------------------------------------------------------


class DraftSpec(Strict):
    method: str
    num_speculative_tokens: int = Field(default=3, ge=1)


class ModelEntry(Strict):
    """A model the cases may name: a real hub id for users with hub access, a tiny local builder for offline runs."""

    description: str = ""
    hub_id: str | None = None
    tiny: str | None = None
    engine_args: dict[str, Any] = Field(default_factory=dict)
    hub_engine_args: dict[str, Any] = Field(default_factory=dict)
    draft: DraftSpec | None = None
    for_model: str | None = None

    @model_validator(mode="after")
    def _has_a_source(self) -> ModelEntry:
        if not self.hub_id and not self.tiny:
            raise ValueError("a model needs a hub_id, a tiny builder, or both")
        return self


# x86 CPU levels, lowest first: a class of a lower level can be emulated on a CPU of a higher one.
X86_CPU_LEVELS = ("avx2", "avx512", "amx")


class GpuClass(Strict):
    """One column of the matrix: what decides vLLM's behaviour on that class."""

    device: Literal["cpu", "cuda"]
    compute_capability: str | None = None
    # CPU classes: the architecture (platform.machine()) and the best level vLLM's CPU backend decides by there
    # (x86: amx with AMX tiles, avx512, else avx2; Arm: neon), which decides its kernels, backends and refusals.
    cpu_arch: str | None = None
    cpu_isa: Literal["amx", "avx512", "avx2", "neon"] | None = None
    memory_gb: list[float] = Field(default_factory=list)
    names: list[str] = Field(default_factory=list)
    engine_defaults: dict[str, Any] = Field(default_factory=dict)
    slots_per_device: int = Field(default=1, ge=1)
