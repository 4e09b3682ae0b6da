"""Cell records on disk: one JSON object per (cell, GPU class) under `reports/runs/<run-id>/` of the working
directory (or the folder `--runs-dir` names): an installed kvmatrix writes where it is run, never into its package.

Writes are atomic (a temporary file in the same folder, then `os.replace`), so a run killed at any moment leaves
each record either whole or absent, and a rerun with the same run id skips exactly the finished cells. Tools
outside the project read these files: `cell_id` (str) and `verdict` are always at the top level. A record file
holds a JudgedRecord (harness/record/model.py), checked as it is written and read, and a cell's result file a
CellOutput, checked as it is read: a malformed one raises RecordError naming the file and the field.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kvmatrix.harness.record.model import VERDICTS, CellOutput, JudgedRecord, check_cell_output, check_judged

# Relative: resolved against the working directory when used (RunDir makes its root absolute).
RUNS_DIR = Path("reports") / "runs"


def run_mode(record: CellOutput) -> str:
    """"full" or "probe" (`kvmatrix run --probe-only`); records from before the modes existed ran in full."""
    return record.get("mode") or "full"


def record_stem(cell_id: str, gpu_class: str) -> str:
    """A file name that cannot leave the run folder: `/`, `\\` and `%` are escaped, so `..` stays in a name."""
    return quote(f"{gpu_class}--{cell_id}", safe="[]=,+-_.@")


class RunDir:
    def __init__(self, root: Path):
        self.root = Path(root).absolute()  # cell processes run elsewhere: every path they get is absolute
        self.logs = self.root / "logs"

    def record_path(self, cell_id: str, gpu_class: str) -> Path:
        return self.root / f"{record_stem(cell_id, gpu_class)}.json"

    def log_path(self, cell_id: str, gpu_class: str) -> Path:
        return self.logs / f"{record_stem(cell_id, gpu_class)}.log"

    def write(self, record: JudgedRecord) -> Path:
        if record.get("verdict") not in VERDICTS or not isinstance(record.get("cell_id"), str):
            raise ValueError(f"a record needs cell_id and a verdict in {VERDICTS}: {record.get('cell_id')!r}")
        path = self.record_path(record["cell_id"], record["gpu_class"])
        write_json_atomic(path, check_judged(record, str(path)))
        return path

    def read(self, cell_id: str, gpu_class: str) -> JudgedRecord | None:
        """The finished record, or None (absent, or unreadable: then the cell runs again)."""
        return read_json(self.record_path(cell_id, gpu_class))

    def records(self) -> list[JudgedRecord]:
        out = []
        for path in sorted(self.root.glob("*.json")):
            if path.name == "run.json" or path.name.startswith("."):  # .tmp-*: a write not yet renamed
                continue
            rec = read_json(path)
            if rec is not None:
                out.append(rec)
        return out


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=False, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_tail(path: Path, n: int = 8000) -> str:
    """The last `n` bytes of a text file (a cell's log), as text; empty where it cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return ""
    return data[-n:].decode(errors="replace")


def read_result(path: Path | str) -> CellOutput:
    """A cell's result file as far as the cell wrote it (it rewrites the file after every phase), checked as the
    cell's output; {} where it wrote none, or none that parses."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return check_cell_output(data, str(path)) if isinstance(data, dict) else {}


def read_json(path: Path) -> JudgedRecord | None:
    """The judged record in a file; None where there is none (absent, torn, not a record). A file that is a
    record (a `cell_id` and a verdict) but holds a wrong field raises RecordError."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(data, dict) and "cell_id" in data and data.get("verdict") in VERDICTS):
        return None
    return check_judged(data, str(path))
