"""What the runs on this cache folder last saw of each cell (its wall time, its verdict, the attention backend vLLM
picked), kept beside the compile and JIT caches: the next run on the same caches orders its cells longest first,
failures of last time first, and knows which cold cells compile the same kernels, as a history database would
(`--db`), without one. One file per GPU class and vLLM version, updated as each record is written."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from urllib.parse import quote

from kvmatrix.harness.judge.facts import facts
from kvmatrix.harness.record.files import write_json_atomic
from kvmatrix.harness.record.types import JudgedRecord

_lock = threading.Lock()


def last_run_file(cache_dir: Path, gpu_name: str, vllm_version: str | None) -> Path:
    return cache_dir / "last-run" / quote(f"{gpu_name}-vllm{vllm_version}.json", safe="")


def remember(path: Path, record: JudgedRecord) -> None:
    """Keep one cell's record's wall time, verdict and backend. Best effort: a file that cannot be written costs
    the next run its order, never this run."""
    if record.get("verdict") == "skip" or "total_s" not in (record.get("timings") or {}):
        return
    seen = {"total_s": record["timings"]["total_s"], "verdict": record["verdict"],
            "backend": facts(record).get("backend")}
    with _lock:
        try:
            cells = _read(path)
            cells[record["cell_id"]] = seen
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, cells)
        except OSError:
            pass


def recall(path: Path) -> tuple[dict[str, float], dict[str, str], dict[str, str]]:
    """(cell id → seconds, cell id → verdict, cell id → backend) of the runs on these caches; empty without one."""
    cells = _read(path)
    return ({cell: seen["total_s"] for cell, seen in cells.items()},
            {cell: seen["verdict"] for cell, seen in cells.items()},
            {cell: seen["backend"] for cell, seen in cells.items() if seen.get("backend")})


def _read(path: Path) -> dict[str, dict]:
    try:
        cells = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(cells, dict):
        return {}
    return {cell: seen for cell, seen in cells.items()
            if isinstance(seen, dict) and isinstance(seen.get("total_s"), (int, float))
            and isinstance(seen.get("verdict"), str)}
