"""Which cells a vLLM change touches, and why: pure logic over the files a diff names and a run's records.

A cell is selected when a changed file is a module its record names (the backend, builder, KV spec or quant
method classes it resolved: vllm_compat.recorded_modules), or the package such a module lives in (`__init__.py`),
or a path every cell depends on (vllm_compat.SELECT_ALL_PATHS: configuration, engine arguments, the KV-cache
manager), which selects them all. A crashed cell's record also names the vLLM modules its traceback runs through;
one that names no module at all can be matched with nothing, so any change to vLLM's Python selects it.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kvmatrix.harness.vllm_compat import recorded_modules, select_all_reason

PACKAGE = "vllm/"


@dataclass(frozen=True)
class Why:
    path: str  # the changed file
    because: str  # what it is to the cell: "= vllm.x.y (H200: layer ... backend FLASHINFER)", or a reason


@dataclass
class Selection:
    files: list[str]
    cells: dict[str, list[Why]] = field(default_factory=dict)  # cell id -> why it was selected, in file order
    unmatched: list[str] = field(default_factory=list)  # changed files no record names (and not select-all)
    considered: int = 0  # cells the records hold

    def lines(self) -> list[str]:
        out = [f"{len(self.files)} files changed; {len(self.cells)} of {self.considered} recorded cells selected"]
        for cell_id, whys in self.cells.items():
            out.append(f"  {cell_id}")
            shown = list(dict.fromkeys(whys))
            out += [f"    {w.path}: {w.because}" for w in shown[:6]]
            if len(shown) > 6:
                out.append(f"    ... and {len(shown) - 6} more")
        if self.unmatched:
            out.append("changed files no selected cell's record names: " + ", ".join(self.unmatched))
        return out


def file_module(path: str) -> tuple[str, bool] | None:
    """A checkout path's module and whether it is a package's `__init__`: vllm/a/b.py -> (vllm.a.b, False);
    None for anything that is not Python under vllm/."""
    if not (path.startswith(PACKAGE) and path.endswith(".py")):
        return None
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def load_records(folder: Path) -> list[dict]:
    """Every record (a JSON object with a cell_id) in a run folder; the class from the record or the folder."""
    out = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("cell_id"), str):
            data.setdefault("gpu_class", data.get("gpu_class") or Path(folder).name)
            out.append(data)
    return out


def _matches(module: str, is_package: bool, recorded: str) -> bool:
    return recorded == module or (is_package and recorded.startswith(module + "."))


def _recorded(records: list[dict]) -> dict[str, list[tuple[str, list[tuple[str, str]]]]]:
    """cell id -> for each of its records: (GPU class, [(where, module), ...])."""
    out: dict[str, list] = {}
    for record in records:
        out.setdefault(record["cell_id"], []).append((record.get("gpu_class") or "?", list(recorded_modules(record))))
    return out


def _touches(path: str, per_record: list[tuple[str, list[tuple[str, str]]]]) -> list[Why]:
    """Why the changed Python file `path` touches a cell, from its records (empty: it does not)."""
    module = file_module(path)
    if module is None:
        return []
    whys = []
    for gpu, named in per_record:
        if not named:
            whys.append(Why(path, f"its {gpu} record names no module: any change may matter"))
        hits: dict[str, Counter] = {}
        for where, recorded in named:
            if _matches(*module, recorded):
                hits.setdefault(recorded, Counter())[where] += 1
        for recorded, wheres in hits.items():
            said = ", ".join(w if n == 1 else f"{w} x{n}" for w, n in wheres.items())
            whys.append(Why(path, f"= {recorded} ({gpu}: {said})"))
    return whys


def select(files: list[str], records: list[dict], version: str | None = None) -> Selection:
    """The cells of `records` that the changed `files` touch, each with why."""
    recorded = _recorded(records)
    selection = Selection(list(files), considered=len(recorded))
    for path in files:
        reason = select_all_reason(path, version)
        for cell_id, per_record in recorded.items():
            whys = [Why(path, f"a path every cell depends on ({reason})")] if reason else _touches(path, per_record)
            if whys:
                selection.cells.setdefault(cell_id, []).extend(whys)
    touched = {w.path for whys in selection.cells.values() for w in whys}
    selection.unmatched = [p for p in files if p not in touched]
    selection.cells = {c: selection.cells[c] for c in recorded if c in selection.cells}  # in record order
    return selection
