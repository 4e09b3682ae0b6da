"""`kvmatrix audit`: is every FAIL and ERROR of a run vLLM's fault, and known? The false-alarm check.

A run's records are judged again under the current case files, signature table and waivers (no vLLM runs); a
FAIL or ERROR that neither a case (`crash:` / `refuse:`) nor a waiver explains is listed: either a vLLM bug to
report (then waive it with its link) or a false alarm of ours (a platform's clear refusal, a renamed attribute,
a harness bug) to fix. `--run` first runs the matrix for every class this machine can run or emulate.
The target is an empty list. Its arguments, and its exit status (1 otherwise), are harness/cli/audit.py's.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
from collections import Counter
from pathlib import Path

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.known_failures import known_failures_for
from kvmatrix.harness.judge.outcome import reclassified
from kvmatrix.harness.judge.waivers import waive
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.neighbours import neighbours_of
from kvmatrix.harness.record.parts import FAILING_VERDICTS, VERDICTS
from kvmatrix.harness.record.paths import CELL_CWD
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.run.session import session_waivers, this_device
from kvmatrix.harness.vllm_compat import ENVIRONMENT_SIGNATURES, installed_vllm_version
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import case_files, load_cases, load_models, load_pool
from kvmatrix.matrix.machine import PoolError, resolve


def runnable_classes(cases_dir: Path) -> list[str]:
    """This machine's class first, then every class it can emulate (the pool's own rule, `resolve`)."""
    pool, device = load_pool(cases_dir), this_device()
    here, _ = resolve(None, pool, device)
    classes = [here]
    for name in pool:
        if name == here:
            continue
        try:
            resolve(name, pool, device, emulate=True)
        except PoolError:
            continue
        classes.append(name)
    return classes


def run_classes(classes: list[str], runs_dir: Path, extra: list[str]) -> list[Path]:
    """One `kvmatrix run` per class (its own process: each class's cells, progress lines and reports)."""
    folders = []
    for gpu in classes:
        run_id = f"audit-{gpu}-vllm{installed_vllm_version()}"
        command = [sys.executable, "-m", "kvmatrix.harness.cli", "run", "--gpu", gpu, "--emulate", "--run-id", run_id,
                   "--runs-dir", str(runs_dir.absolute()), *extra]
        print("$ " + " ".join(command[1:]), flush=True)
        subprocess.run(command, cwd=CELL_CWD, check=False)  # its failures are what the audit lists
        folders.append(runs_dir / run_id)
    return folders


def rejudged(run_dir: RunDir, cases_dir: Path) -> list[tuple[JudgedRecord, JudgedRecord]]:
    """(record as stored, record judged again now with waivers applied) for every record of a run folder."""
    pool, models = load_pool(cases_dir), load_models(cases_dir)
    waivers = session_waivers(cases_dir, pool)
    cells = {c.cell_id: c for c in expand_all(load_cases(case_files(cases_dir)), models, pool)}
    known, today = known_failures_for(cells.values()), datetime.date.today()
    pairs = []
    for stored in run_dir.records():
        cell, gpu = cells.get(stored["cell_id"]), stored.get("gpu_class")
        if stored.get("unreadable_record"):  # a file that could not be read: nothing to judge, an error as it is
            pairs.append((stored, stored))
            continue
        if cell is not None and gpu in pool and stored.get("status") != "skipped":
            task = Task(cell, gpu, pool[gpu], stored.get("emulated_from"))
            now = judge_record(reclassified(stored, run_dir.log_tail(stored)), task, neighbours_of(task, run_dir),
                               waivers, today, known)
        else:
            now = stored if cell is not None else {
                **stored, "verdict": "error", "reason": "no cell of the current cases has this id (renamed or removed)"}
            now, _ = waive(now, waivers, today)
        pairs.append((stored, now))
    return pairs


def render(pairs_by_run: dict[str, list[tuple[JudgedRecord, JudgedRecord]]]) -> tuple[str, int]:
    """The Markdown audit (a table per run: verdicts as stored and as judged now) and the unexplained count."""
    lines = ["| run | class | emulated on | vLLM | cells | " + " | ".join(VERDICTS)
             + " | FAIL+ERROR as stored | environment | unexplained now |", "|" + "---|" * (len(VERDICTS) + 8)]
    unexplained, environment = [], []
    for run, pairs in pairs_by_run.items():
        for gpu in sorted({now["gpu_class"] for _, now in pairs}):
            mine = [(s, n) for s, n in pairs if n.get("gpu_class") == gpu]
            counts = Counter(n["verdict"] for _, n in mine)
            before = sum(s["verdict"] in FAILING_VERDICTS for s, _ in mine)
            bad = [n for _, n in mine if n["verdict"] in FAILING_VERDICTS]
            # A broken environment (a package vLLM imports is missing, ...) cannot judge vLLM: run it again.
            broken = [n for n in bad if n["verdict"] == "error" and n.get("signature") in ENVIRONMENT_SIGNATURES]
            environment += [(run, n) for n in broken]
            unexplained += [(run, n) for n in bad if n not in broken]
            first = mine[0][1]
            # A cell that did not run (a skip) has no vLLM version: the run's is that of any cell that ran.
            version = next((n["vllm_version"] for _, n in mine if n.get("vllm_version")), None)
            lines.append(f"| {run} | {gpu} | {first.get('emulated_from') or '-'} | {version} | "
                         f"{len(mine)} | " + " | ".join(str(counts.get(v, 0)) for v in VERDICTS)
                         + f" | {before} | {len(broken)} | {len(bad) - len(broken)} |")
    lines += ["", f"Unexplained FAIL / ERROR: {len(unexplained)}", ""] + _listed(unexplained)
    if environment:
        lines += ["", f"ERROR of the environment, not vLLM (a missing package, packed cells' memory check; run "
                      f"again where it is sound): {len(environment)}", ""] + _listed(environment)
    return "\n".join(lines) + "\n", len(unexplained)


def _listed(found: list[tuple[str, JudgedRecord]]) -> list[str]:
    return [f"- **{n['verdict'].upper()}** `{n['cell_id']}` @{n.get('gpu_class')} ({run}): {n.get('reason')}"
            for run, n in found]
