"""Cell records on disk: one JSON object per (cell, GPU class) under `reports/runs/<run-id>/` of the working
directory (or the folder `--runs-dir` names): an installed kvmatrix writes where it is run, never into its package.

Writes are atomic (a temporary file in the same folder, then `os.replace`), so a run killed at any moment leaves
each record either whole or absent, and a rerun with the same run id skips exactly the finished cells. Tools
outside the project read these files: `cell_id` (str) and `verdict` are always at the top level. A record file
holds a JudgedRecord (harness/record/types.py), checked as it is written and read, and a cell's result file a
CellOutput, checked as it is read: a malformed one raises RecordError naming the file and the field. A record file
that cannot be read (torn by a disk, emptied, edited, of the wrong phase) is never dropped: `RunDir.records` shows it
as an `error` of its cell (`unreadable_record`), and every command that reads runs counts it and exits non-zero.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from kvmatrix.harness.record.types import (
    VERDICTS,
    CellOutput,
    JudgedRecord,
    OutcomeRecord,
    RecordError,
    check_cell_output,
    check_judged,
)

# Relative: resolved against the working directory when used (RunDir makes its root absolute).
RUNS_DIR = Path("reports") / "runs"


def run_mode(record: CellOutput) -> str:
    """"full" or "probe" (`kvmatrix run --probe-only`); records from before the modes existed ran in full."""
    return record.get("mode") or "full"


# A record's name, and the names beside it (`<stem>.<pid>.result.json` in work/), stay under the 255 bytes a file
# name may have: a 206-character case name made one too long, and the cell could not be recorded.
MAX_STEM_BYTES = 200


def record_stem(cell_id: str, gpu_class: str) -> str:
    """A file name that cannot leave the run folder: `/`, `\\` and `%` are escaped, so `..` stays in a name; a
    longer one than MAX_STEM_BYTES keeps its start and ends in a hash of the whole (the same every run)."""
    stem = quote(f"{gpu_class}--{cell_id}", safe="[]=,+-_.@")  # ASCII: a character is a byte
    if len(stem) <= MAX_STEM_BYTES:
        return stem
    return f"{stem[:MAX_STEM_BYTES - 17]}~{hashlib.sha256(stem.encode()).hexdigest()[:16]}"


class RunDir:
    def __init__(self, root: Path):
        self.root = Path(root).absolute()  # cell processes run elsewhere: every path they get is absolute
        self.logs = self.root / "logs"

    def record_path(self, cell_id: str, gpu_class: str) -> Path:
        return self.root / f"{record_stem(cell_id, gpu_class)}.json"

    def log_path(self, cell_id: str, gpu_class: str) -> Path:
        return self.logs / f"{record_stem(cell_id, gpu_class)}.log"

    def log_tail(self, record: OutcomeRecord) -> str:
        """The tail of the cell log a record names (empty where it names none, or it cannot be read)."""
        return read_tail(self.root / record["log"]) if record.get("log") else ""

    def write(self, record: JudgedRecord) -> Path:
        if record.get("verdict") not in VERDICTS or not isinstance(record.get("cell_id"), str):
            raise ValueError(f"a record needs cell_id and a verdict in {VERDICTS}: {record.get('cell_id')!r}")
        if record.get("unreadable_record"):  # written, it would pass for the cell's own and stop a resume running it
            raise ValueError(f"the stand-in for an unreadable record file is never written: {record['cell_id']!r}")
        path = self.record_path(record["cell_id"], record["gpu_class"])
        write_json_atomic(path, check_judged(record, str(path)))
        return path

    def read(self, cell_id: str, gpu_class: str) -> JudgedRecord | None:
        """The finished record, or None (absent, or unreadable: then the cell runs again)."""
        return read_json(self.record_path(cell_id, gpu_class))

    def records(self) -> list[JudgedRecord]:
        """Every record of the folder; a file that cannot be read as one (torn, empty, not JSON, not a judged
        record) is there as an `error` record saying so (`unreadable_record`): a reader never loses a cell."""
        out: list[JudgedRecord] = []
        claims: dict[tuple[str, str], list[Path]] = {}  # (cell, class) -> the files holding its record
        for path in sorted(self.root.glob("*.json")):
            if path.name == "run.json" or path.name.startswith("."):  # .tmp-*: a write not yet renamed
                continue
            record, why = read_record(path)
            if record is None:
                out.append(unreadable_record(path, why or "absent"))
                continue
            key = (record["cell_id"], record.get("gpu_class", "?"))
            claims.setdefault(key, []).append(path)
            if len(claims[key]) == 1:
                out.append(record)
            else:  # a second file for one cell (a copy of a PASS beside its FAIL): neither is believed
                out = [r for r in out if (r["cell_id"], r.get("gpu_class", "?")) != key]
                out.append(duplicate_record(*key, claims[key]))
        return out


def json_text(data: Mapping[str, Any]) -> str:
    """A record (or run.json) as its file holds it: one top-level field a line, each value on its line compact.
    Each value goes through Python's C JSON encoder; `json.dumps(indent=...)` takes the pure-Python one, with which
    judging the fixture runs again took twice the CPU (tests/test_rejudge_is_judge.py: 32 CPU-s against 16)."""
    fields = ",\n".join(f"{json.dumps(str(key))}: {json.dumps(value, default=str)}" for key, value in data.items())
    return "{\n" + fields + "\n}" if fields else "{}"


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    write_text_atomic(path, json_text(data), suffix=".json")


def write_text_atomic(path: Path, text: str, suffix: str = "") -> None:
    """`path` holding `text`, or as it was: a temporary file beside it renamed over it (a full disk leaves the last
    report whole, never an empty one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=suffix)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
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


def read_record(path: Path) -> tuple[JudgedRecord | None, str | None]:
    """(the judged record in a file, None) or (None, why it is not one: unreadable, torn or empty, not a judged
    record, a field its phase does not have)."""
    try:
        data = json.loads(Path(path).read_bytes())
    except OSError as err:
        return None, f"cannot be read: {err.strerror}"
    except ValueError as err:  # torn or empty (json's own error), or not UTF-8 (a UnicodeDecodeError)
        return None, f"not JSON ({err})"[:300]
    if not (isinstance(data, dict) and isinstance(data.get("cell_id"), str) and data.get("verdict") in VERDICTS):
        return None, "not a judged record (no cell_id or verdict)"
    try:
        return check_judged(data, Path(path).name), None
    except RecordError as err:
        return None, str(err)[:300]


def read_json(path: Path) -> JudgedRecord | None:
    """The judged record in a file; None where there is none that can be read (absent, torn, not a judged record):
    a resumed run runs such a cell again, and RunDir.records shows it as an error meanwhile."""
    return read_record(path)[0]


def unreadable(records: list[JudgedRecord]) -> list[JudgedRecord]:
    """The stand-ins for record files that could not be read (RunDir.records)."""
    return [r for r in records if r.get("unreadable_record")]


def unreadable_record(path: Path, why: str) -> JudgedRecord:
    """What a reader shows for a record file it cannot read: an `error` of the cell the file name names (a name
    shortened by record_stem keeps its start), never a record file of its own."""
    gpu_class, _, cell_id = unquote(Path(path).stem).partition("--")
    cell_id = cell_id or gpu_class
    record = JudgedRecord(cell_id=cell_id, case=cell_id.split("[")[0], gpu_class=gpu_class if cell_id != gpu_class
                          else "?", status="error", verdict="error", expectations=[], unreadable_record=why,
                          reason=f"the record file {Path(path).name} cannot be read ({why}): what the cell did is "
                                 "unknown; the same run id runs the cell again")
    return check_judged(record, f"the stand-in for {Path(path).name}")


def duplicate_record(cell_id: str, gpu_class: str, paths: list[Path]) -> JudgedRecord:
    """What a reader shows for a cell that several record files claim: an `error` naming them (which one the run
    wrote is not for a reader to guess: a copied PASS would hide the cell's FAIL), never a record file of its own."""
    names = ", ".join(p.name for p in paths)
    why = f"{len(paths)} record files claim this cell: {names}"
    record = JudgedRecord(cell_id=cell_id, case=cell_id.split("[")[0], gpu_class=gpu_class, status="error",
                          verdict="error", expectations=[], unreadable_record=why,
                          reason=f"{why}; one record per cell: remove the ones that are not "
                                 f"{record_stem(cell_id, gpu_class)}.json, or run the cell again")
    return check_judged(record, f"the stand-in for {names}")
