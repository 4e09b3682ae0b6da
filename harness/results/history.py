"""The results history: every run's records in one embedded SQLite file, for "what changed since last night".

A run is keyed by (run id, GPU class): nightly CI runs one job per GPU class, possibly under one shared run id,
and each job's result folder is imported on its own, so merging machines is importing each of their folders.
Imports are idempotent (a record replaces the one with the same run, class and cell), so a resumed or re-merged
run can be imported again. The whole record is kept as JSON; the columns beside it are what queries filter on,
among them each failure's crash fingerprint, so that a crash can be dated to the run it was first seen in.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from pathlib import Path

import pandas as pd

from kvmatrix.harness.judge.facts import facts
from kvmatrix.harness.judge.fingerprint import fingerprint
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.types import JudgedRecord, check_judged, finished_now

DEFAULT_DB = Path("reports") / "history.sqlite"  # in the working directory, beside its reports/runs/

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT NOT NULL,
    gpu_class TEXT NOT NULL,
    vllm_version TEXT,
    vllm_commit TEXT,
    finished_at TEXT,          -- the last record's finish time: what orders runs of a class
    imported_at TEXT NOT NULL,
    PRIMARY KEY (run_id, gpu_class)
);
CREATE TABLE IF NOT EXISTS results (
    run_id TEXT NOT NULL,
    gpu_class TEXT NOT NULL,
    cell_id TEXT NOT NULL,
    case_name TEXT,
    verdict TEXT NOT NULL,
    reason TEXT,
    status TEXT,
    signature TEXT,
    flaky INTEGER NOT NULL DEFAULT 0,
    emulated_from TEXT,
    vllm_version TEXT,
    vllm_commit TEXT,
    total_s REAL,
    finished_at TEXT,
    log TEXT,
    record TEXT NOT NULL,      -- the whole record, as written by the runner
    fingerprint TEXT,          -- the crash's (harness/judge/fingerprint.py); NULL for cells that ran ok or were skipped
    PRIMARY KEY (run_id, gpu_class, cell_id),
    FOREIGN KEY (run_id, gpu_class) REFERENCES runs (run_id, gpu_class)
);
CREATE INDEX IF NOT EXISTS results_by_cell ON results (gpu_class, cell_id);
"""
_COLUMNS = ("run_id", "gpu_class", "cell_id", "case_name", "verdict", "reason", "status", "signature", "flaky",
            "emulated_from", "vllm_version", "vllm_commit", "total_s", "finished_at", "log", "record", "fingerprint")


class NotAHistory(sqlite3.DatabaseError):
    """A file that SQLite reads but that holds no history of this harness's shape."""


def open_db(path: Path | str = DEFAULT_DB) -> sqlite3.Connection:
    """The history at `path` (a new one where there is none). One that is damaged (not SQLite, a corrupt page,
    tables of another shape) is set aside, renamed with a `.corrupt-<time>` suffix, with a message on stderr, and a
    new one starts: the history orders and compares runs, it never stops one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _open(path)
    except sqlite3.DatabaseError as err:
        if not _damaged(err):  # "database is locked" and such: the history is sound
            raise
        aside = _set_aside(path)
        print(f"kvmatrix: {path} is not a history database this harness can read ({err}); set aside as "
              f"{aside.name}, a new one starts", file=sys.stderr)
        return _open(path)


def _open(path: Path) -> sqlite3.Connection:
    # Several CI jobs (or xdist workers) may import at once: wait for the lock rather than fail, and let readers
    # go on while one writes (WAL).
    db = sqlite3.connect(path, timeout=60)
    try:
        (check,) = db.execute("PRAGMA quick_check").fetchone()
        if check != "ok":
            raise NotAHistory(f"damaged: {check}")
        missing = set(_COLUMNS) - {"fingerprint"} - _columns(db)  # fingerprints are added to older histories
        if _columns(db) and missing:
            raise NotAHistory(f"its results table lacks {sorted(missing)}")
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(_SCHEMA)
        _add_fingerprints(db)
        db.execute("CREATE INDEX IF NOT EXISTS results_by_fingerprint ON results (fingerprint)")
    except BaseException:
        db.close()
        raise
    return db


def _damaged(err: sqlite3.DatabaseError) -> bool:
    """Whether an error opening a history says the file is not one (rather than busy, or out of disk)."""
    return isinstance(err, NotAHistory) or getattr(err, "sqlite_errorcode", None) in (sqlite3.SQLITE_NOTADB,
                                                                                   sqlite3.SQLITE_CORRUPT)


def _set_aside(path: Path) -> Path:
    """Rename a damaged history (and its WAL files) out of the way; the new name."""
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    for suffix in ("", "-wal", "-shm"):
        part = Path(f"{path}{suffix}")
        if part.exists():
            part.rename(f"{aside}{suffix}")
    return aside


def _add_fingerprints(db: sqlite3.Connection) -> None:
    """Databases written before fingerprints get the column, filled from their stored records. Under a write
    lock: several importers may open an old database at once."""
    if "fingerprint" in _columns(db):
        return
    with db:
        db.execute("BEGIN IMMEDIATE")
        if "fingerprint" in _columns(db):  # another process migrated it while this one waited for the lock
            return
        db.execute("ALTER TABLE results ADD COLUMN fingerprint TEXT")
        rows = db.execute("SELECT rowid, record FROM results").fetchall()
        db.executemany("UPDATE results SET fingerprint = ? WHERE rowid = ?",
                       [(_fingerprint_of(json.loads(record)), rowid) for rowid, record in rows])


def _columns(db: sqlite3.Connection) -> set[str]:
    return {row[1] for row in db.execute("PRAGMA table_info(results)")}


def _fingerprint_of(record: JudgedRecord) -> str | None:
    """The record's own fingerprint; records of earlier harnesses get one from their exception."""
    if record.get("fingerprint"):
        return record["fingerprint"]
    crash = fingerprint(record)
    return crash.id if crash else None


def import_records(db: sqlite3.Connection, records: list[JudgedRecord], run_id: str | None = None,
                   vllm_commit: str | None = None) -> list[tuple[str, str]]:
    """Store records (one run folder's, or any list); returns the (run id, GPU class) runs they belong to.

    The run id is the record's own (the runner writes it), else `run_id`; the vLLM commit is the record's
    `vllm_commit`, else `vllm_commit` (CI knows which vLLM build it installed)."""
    runs: dict[tuple[str, str], dict] = {}
    now = finished_now()
    with db:
        for rec in records:
            rid = rec.get("run_id") or run_id
            if not rid:
                raise ValueError(f"record {rec['cell_id']!r} has no run_id and none was given")
            gpu = rec.get("gpu_class") or "?"
            commit = rec.get("vllm_commit") or vllm_commit
            db.execute(
                f"INSERT OR REPLACE INTO results ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                (rid, gpu, rec["cell_id"], rec.get("case"), rec["verdict"], rec.get("reason"), rec.get("status"),
                 rec.get("signature"), int(bool(rec.get("flaky"))), rec.get("emulated_from"),
                 rec.get("vllm_version"), commit, (rec.get("timings") or {}).get("total_s"),
                 rec.get("finished_at"), rec.get("log"), json.dumps(rec, default=str), _fingerprint_of(rec)),
            )
            run = runs.setdefault((rid, gpu), {"vllm_version": None, "vllm_commit": None})
            run["vllm_version"] = run["vllm_version"] or rec.get("vllm_version")
            run["vllm_commit"] = run["vllm_commit"] or commit
        for (rid, gpu), run in runs.items():
            # Recomputed from every stored result, so importing a run in pieces gives the same row. A run of
            # skipped cells only has no finish time: it is placed at its import.
            (finished,) = db.execute("SELECT MAX(finished_at) FROM results WHERE run_id = ? AND gpu_class = ?",
                                     (rid, gpu)).fetchone()
            db.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, gpu_class) DO UPDATE"
                " SET vllm_version = COALESCE(excluded.vllm_version, vllm_version),"
                " vllm_commit = COALESCE(excluded.vllm_commit, vllm_commit),"
                " finished_at = COALESCE(?, finished_at), imported_at = excluded.imported_at",
                (rid, gpu, run["vllm_version"], run["vllm_commit"], finished or now, now, finished),
            )
    return sorted(runs)


def import_run(db: sqlite3.Connection, run_dir: Path | str, vllm_commit: str | None = None) -> list[tuple[str, str]]:
    """Import one run folder (`reports/runs/<run-id>/`); its name is the run id of records that lack one."""
    folder = RunDir(Path(run_dir))
    return import_records(db, folder.records(), run_id=folder.root.name, vllm_commit=vllm_commit)


def runs_frame(db: sqlite3.Connection) -> pd.DataFrame:
    """Every (run, GPU class) with its vLLM and cell counts per verdict, oldest first."""
    return pd.read_sql(
        "SELECT r.run_id, r.gpu_class, r.vllm_version, r.vllm_commit, r.finished_at, COUNT(*) AS cells,"
        " SUM(x.verdict = 'pass') AS pass, SUM(x.verdict IN ('fail', 'error')) AS failing,"
        " SUM(x.verdict = 'xfail') AS xfail, SUM(x.flaky) AS flaky"
        " FROM runs r JOIN results x USING (run_id, gpu_class)"
        " GROUP BY r.run_id, r.gpu_class ORDER BY r.finished_at, r.run_id", db)


def results_frame(db: sqlite3.Connection, run_id: str | None = None) -> pd.DataFrame:
    """The results' columns (not the JSON), for one run or all of them."""
    where, params = ("WHERE run_id = ?", (run_id,)) if run_id else ("", ())
    return pd.read_sql(f"SELECT * FROM results {where} ORDER BY run_id, gpu_class, cell_id", db,
                       params=params).drop(columns="record")


def records_of(db: sqlite3.Connection, run_id: str, gpu_class: str | None = None) -> list[JudgedRecord]:
    """The stored records of a run (of one class), each checked as a judged record."""
    sql, params = "SELECT gpu_class, cell_id, record FROM results WHERE run_id = ?", [run_id]
    if gpu_class is not None:
        sql += " AND gpu_class = ?"
        params.append(gpu_class)
    return [check_judged(json.loads(record), f"history record {cell_id} @{gpu} of run {run_id}")
            for gpu, cell_id, record in db.execute(sql + " ORDER BY gpu_class, cell_id", params)]


def classes_of(db: sqlite3.Connection, run_id: str) -> list[str]:
    return [row[0] for row in db.execute("SELECT gpu_class FROM runs WHERE run_id = ? ORDER BY gpu_class",
                                         (run_id,))]


def latest_run(db: sqlite3.Connection) -> str | None:
    row = db.execute("SELECT run_id FROM runs ORDER BY finished_at DESC, run_id DESC LIMIT 1").fetchone()
    return row[0] if row else None


def previous_run(db: sqlite3.Connection, run_id: str, gpu_class: str) -> str | None:
    """The run of this GPU class that finished last before `run_id` did (ties broken by run id)."""
    row = db.execute(
        "SELECT p.run_id FROM runs p JOIN runs r ON r.run_id = ? AND r.gpu_class = p.gpu_class"
        " WHERE p.gpu_class = ? AND p.run_id != r.run_id"
        " AND (p.finished_at < r.finished_at OR (p.finished_at = r.finished_at AND p.run_id < r.run_id))"
        " ORDER BY p.finished_at DESC, p.run_id DESC LIMIT 1",
        (run_id, gpu_class),
    ).fetchone()
    return row[0] if row else None


def last_timings(db: sqlite3.Connection, gpu_class: str) -> dict[str, float]:
    """Each cell's wall time on this GPU class in the latest run that timed it: what the scheduler expects."""
    rows = db.execute("SELECT cell_id, total_s FROM results WHERE gpu_class = ? AND total_s IS NOT NULL"
                      " ORDER BY finished_at, run_id", (gpu_class,))
    return dict(rows.fetchall())  # later runs' rows overwrite earlier ones


def last_verdicts(db: sqlite3.Connection, gpu_class: str) -> dict[str, str]:
    """Each cell's verdict on this GPU class in the latest run that holds it: the scheduler starts the cells
    that failed there first. Runs are ordered by the run's finish (a skip record has no finish time of its own)."""
    rows = db.execute("SELECT x.cell_id, x.verdict FROM results x JOIN runs r USING (run_id, gpu_class)"
                      " WHERE x.gpu_class = ? ORDER BY r.finished_at, x.run_id", (gpu_class,))
    return dict(rows.fetchall())  # later runs' rows overwrite earlier ones


def last_backends(db: sqlite3.Connection, gpu_class: str) -> dict[str, str]:
    """Each cell's attention backend on this GPU class ("A/B" when its layers used several) in the latest run
    that resolved one (a cell that crashed after its engine started resolved it too): which cold cells compile the
    same kernels (harness/run/order/pilots.py)."""
    rows = db.execute("SELECT x.cell_id, x.record FROM results x JOIN runs r USING (run_id, gpu_class)"
                      " WHERE x.gpu_class = ? ORDER BY r.finished_at DESC, x.run_id DESC", (gpu_class,))
    backends: dict[str, str] = {}
    for cell_id, record in rows:  # newest first: a cell's older records are not parsed once it has a backend
        if cell_id not in backends and (backend := facts(json.loads(record)).get("backend")):
            backends[cell_id] = backend
    return backends


def first_seen(db: sqlite3.Connection) -> dict[str, str]:
    """Each crash fingerprint → the run it was first seen in (runs ordered by their finish, as previous_run)."""
    rows = db.execute("SELECT x.fingerprint, x.run_id FROM results x JOIN runs r USING (run_id, gpu_class)"
                      " WHERE x.fingerprint IS NOT NULL ORDER BY r.finished_at DESC, x.run_id DESC")
    return dict(rows.fetchall())  # earlier runs' rows overwrite later ones


def verdict_history(db: sqlite3.Connection, run_id: str, last: int = 8,
                    ) -> dict[tuple[str, str], list[tuple[str, str, str]]]:
    """(GPU class, cell id) → its (run id, verdict, what it resolved) in the last `last` runs of its class up to
    `run_id` that hold it, oldest first: the report's history strip, where a night whose verdict or resolved state
    (backend, KV dtype, query dtype, page size: harness/judge/facts.py) differs from the night before is marked.
    Runs are ordered by their finish, as previous_run orders them."""
    rows = db.execute(
        "SELECT x.gpu_class, x.cell_id, x.run_id, x.verdict, x.record FROM results x"
        " JOIN runs r USING (run_id, gpu_class)"
        " JOIN runs now ON now.run_id = ? AND now.gpu_class = r.gpu_class"
        " WHERE r.finished_at < now.finished_at OR (r.finished_at = now.finished_at AND r.run_id <= now.run_id)"
        " ORDER BY r.finished_at, r.run_id", (run_id,))
    out: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for gpu, cell_id, run, verdict, record in rows:
        resolved = " · ".join(f"{k} {v}" for k, v in facts(json.loads(record)).items())
        out.setdefault((gpu, cell_id), []).append((run, verdict, resolved))
    return {key: runs[-last:] for key, runs in out.items()}
