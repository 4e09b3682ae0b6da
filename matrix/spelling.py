"""Old spellings of case-file fields. A renamed field still loads under its old name for one release, renamed as
it is read and with a warning that names the file, the case, the field, its new spelling and the last kvmatrix
release that accepts it; after that release it is refused with a CaseError. Refusing is one flag to flip
(`Renamed.accepted`), so the release that drops a spelling changes one line and keeps its clear error."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from kvmatrix.matrix.schema import CaseError, located


class OldSpelling(FutureWarning):
    """A case file uses a field's old name (FutureWarning: Python shows it to whoever runs the command)."""


@dataclass(frozen=True)
class Renamed:
    parent: str  # the mapping the field is in
    old: str
    new: str
    meaning: str  # what the field holds, said in the message
    last_release: str  # the last kvmatrix release that still loads the old spelling
    accepted: bool  # False once `last_release` is out: the old spelling is refused

    @property
    def field(self) -> str:
        return f"{self.parent}.{self.old}"

    def advice(self) -> str:
        return f"renamed {self.parent}.{self.new} ({self.meaning}); write {self.parent}.{self.new}"

    def warning(self) -> str:
        return f"{self.advice()}. The old spelling is accepted up to kvmatrix {self.last_release} and refused after it"

    def refusal(self) -> str:
        return f"{self.advice()}. The old spelling was refused after kvmatrix {self.last_release}"


# `matrix.include` added extra matrix points (the CI matrix idea) while a top-level `include:` pulls in shared
# blocks (the lm-evaluation-harness idea): one word, two meanings. The points are `matrix.extra`, beside
# `matrix.exclude`; `include:` means only the shared blocks.
EXTRA_POINTS = Renamed("matrix", "include", "extra",
                       "the extra matrix points, beside matrix.exclude; a top-level include: pulls in shared blocks",
                       last_release="0.2.0", accepted=True)
RENAMED = (EXTRA_POINTS,)


def current_spelling(file: str, case: str, data: dict[str, Any]) -> dict[str, Any]:
    """A case file's (or a shared block's) fields with every old spelling read as its new one (warned of), or
    CaseError for one refused now or given beside its new spelling."""
    for renamed in RENAMED:
        parent = data.get(renamed.parent)
        if not isinstance(parent, dict) or renamed.old not in parent:
            continue
        if renamed.new in parent:
            raise CaseError(file, case, renamed.field, f"given beside {renamed.parent}.{renamed.new}, its new "
                                                       f"spelling: {renamed.advice()} (one list)")
        if not renamed.accepted:
            raise CaseError(file, case, renamed.field, renamed.refusal())
        warnings.warn(OldSpelling(located(file, case, renamed.field, renamed.warning())), stacklevel=2)
        data = {**data, renamed.parent: {(renamed.new if k == renamed.old else k): v for k, v in parent.items()}}
    return data
