"""One task to its judged record: a skip, or its cell process run (again, `retries` times, while it fails).

The cell process (`python -m kvmatrix.harness.cell`) writes what it learned after every phase; this side adds what only
the parent can know (exit status, timing, timeout, signal), classifies the failure and judges the record.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.outcome import classify_outcome
from kvmatrix.harness.judge.waivers import unwaived
from kvmatrix.harness.record.files import read_result, read_tail
from kvmatrix.harness.record.neighbours import neighbours_of
from kvmatrix.harness.record.parts import FAILING_VERDICTS
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import (
    CellOutput,
    JudgedRecord,
    OutcomeRecord,
    Timings,
    WarmAttempt,
    check_cell_output,
    check_judged,
    check_outcome,
    finished_now,
    outcome_of,
)
from kvmatrix.harness.run.host.gpu_memory import physical_index
from kvmatrix.harness.run.model_builds import ensure_models
from kvmatrix.harness.run.process.env import cell_env
from kvmatrix.harness.run.process.gpu_check import check_gpu_memory
from kvmatrix.harness.run.process.groups import CellProcesses, cap_log
from kvmatrix.harness.run.process.launch import FreshProcess, Launcher
from kvmatrix.harness.run.process.start import CellFiles, ShareKey
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.confirmations import Confirmations
from kvmatrix.harness.run.task.skips import not_run_reason
from kvmatrix.harness.run.task.spec import cell_mode, cell_spec, engine_args_for
from kvmatrix.harness.vllm_compat import MULTI_RANK_ENV, engine_phases
from kvmatrix.matrix.conditions import when_matches
from kvmatrix.matrix.expectations import CrashExpected


def base_record(task: Task, run_id: str) -> CellOutput:
    """What every record of a task says before anything runs."""
    cell = task.cell
    record = CellOutput(cell_id=cell.cell_id, case=cell.case.name, model=cell.model, axes=cell.axes,
                        gpu_class=task.gpu_name, emulated_from=task.emulated_from, run_id=run_id)
    return check_cell_output(record, f"the task record of {task.key}")


def result_file(run_root: Path, task: Task) -> Path:
    """Where this harness's cell process of a task writes its result, rewritten as each phase starts (the run's
    heartbeat reads the phase there). Two harnesses on one run folder (xdist workers) never share the file."""
    return run_root / "work" / f"{task.key}.{os.getpid()}.result.json"


def run_attempt(task: Task, settings: RunSettings, processes: CellProcesses, launcher: Launcher,
                extra_env: dict[str, str] | None = None, first_failure: str | None = None,
                built: Mapping[str, Path] | None = None) -> JudgedRecord:
    """One attempt at a cell: its process run once, to a judged record (not yet written); `first_failure`: why an
    earlier attempt failed; `built`: the checkpoint folders of the models built (default: the settings')."""
    cell, run_dir = task.cell, settings.run_dir
    result = result_file(run_dir.root, task)
    files = CellFiles(result.with_name(result.name.replace(".result.", ".spec.")), result,
                      run_dir.log_path(cell.cell_id, task.gpu_name))
    files.result.unlink(missing_ok=True)
    # Which GPU of the machine ran the cell (its slot's pin), for reports of multi-GPU hosts.
    record: OutcomeRecord = {**base_record(task, run_dir.root.name),
                             "gpu_index": (extra_env or {}).get("CUDA_VISIBLE_DEVICES")}
    mode, full_because = cell_mode(cell, settings.probe_only)
    record["mode"] = mode
    if full_because:
        record["mode_note"] = full_because
    gpu = physical_index(record["gpu_index"])
    started = time.monotonic()
    try:
        engine_args = engine_args_for(cell, task.gpu, settings.models, settings.built if built is None else built,
                                      settings.use_hub,
                                      probe=mode == "probe", vllm_version=settings.vllm_version)
    except KeyError as err:
        outcome: OutcomeRecord = {"status": "error", "error_tail": str(err.args[0])}
        return finish(record, task, settings, outcome, started, first_failure)
    record["engine_args"] = engine_args
    spec = cell_spec(task, settings, engine_args, mode)
    spec.write(files.spec)
    files.log.parent.mkdir(parents=True, exist_ok=True)
    timeout = cell.case.timeout_s * settings.timeout_scale
    ranks_env = MULTI_RANK_ENV if cell.gpus_needed > 1 else {}
    env = cell_env(settings, {**cell.case.env, **ranks_env, **(extra_env or {})}, task.key)
    # What is fixed before vLLM's import: cells that differ in it never share a warm worker.
    share_key = ShareKey(tuple(sorted(env.items())), tuple(spec.emulate_capability or ()), spec.emulate_cpu_isa)
    launched = launcher.launch(files, env, share_key, timeout, processes, gpu)
    cap_log(files.log)
    outcome = classify_outcome(launched.returncode, launched.timed_out, timeout, read_result(files.result),
                               read_tail(files.log))
    outcome["log"] = str(files.log.relative_to(run_dir.root))
    add_engine_phases(outcome, files.log, settings.vllm_version)
    outcome["isolation"] = launched.isolation
    outcome["process_start"] = launched.process_start
    if launched.worker is not None:
        outcome["worker"] = launched.worker
        if (teardown_s := launched.worker.get("teardown_s")) is not None:
            outcome.setdefault("timings", {})["teardown_s"] = teardown_s
    if settings.gpu_memory is not None and gpu in processes.gpu_baselines:
        outcome.update(check_gpu_memory(settings.gpu_memory, gpu, processes, settings.gpu_settle_s))
    return finish(record, task, settings, outcome, started, first_failure)


def add_engine_phases(outcome: OutcomeRecord, log: Path, vllm_version: str | None) -> None:
    """The parts of the engine's start that the cell's log times (vLLM's own lines), into the record's timings:
    read after the cell, so a warm worker's cell, a fresh process and every rank of a multi-GPU cell are read
    alike. A log that cannot be read adds nothing (the cell's record never depends on it)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return
    if phases := engine_phases(text, vllm_version or outcome.get("vllm_version")):
        outcome["timings"] = {**(outcome.get("timings") or {}), **phases}  # type: ignore[typeddict-item]


def finish(record: OutcomeRecord, task: Task, settings: RunSettings, outcome: OutcomeRecord, started: float,
           first_failure: str | None = None) -> JudgedRecord:
    """The task's record with the attempt's outcome added (`first_failure`: why this run's earlier attempt failed),
    timed and stamped with when it finished, judged against its neighbours as the run folder holds them now (they
    ran first: harness/run/order/baselines.py)."""
    record.update(outcome)
    record.setdefault("vllm_version", settings.vllm_version)
    record.setdefault("signature", None)
    timings = (record.get("timings") or Timings()).copy()
    timings["total_s"] = round(time.monotonic() - started, 3)
    record["timings"] = timings
    if first_failure is not None:
        record["first_failure"] = first_failure
    record["finished_at"] = finished_now()
    return judged(check_outcome(record, f"the outcome record of {task.key}"), task, settings)


def judged(outcome: OutcomeRecord, task: Task, settings: RunSettings) -> JudgedRecord:
    """The outcome judged as it is written: against the neighbours the run folder holds, under the run's waivers
    and known failures, as of the run's date."""
    return judge_record(outcome, task, neighbours_of(task, settings.run_dir), settings.waivers, settings.today,
                        settings.known_failures)


def skip_record(task: Task, reason: str, run_id: str) -> JudgedRecord:
    """The judged record of a task that does not run (no outcome to judge)."""
    record = {**base_record(task, run_id), "status": "skipped", "verdict": "skip", "reason": reason,
              "expectations": [], "tags": list(task.cell.case.tags)}
    return check_judged(record, f"the skip record of {task.key}")


def unwritable_record(task: Task, run_id: str, err: OSError, record: JudgedRecord | None = None) -> JudgedRecord:
    """The cell's `error` where the harness could not write its files (a full disk, a name too long): shown in the
    reports, never a record file; the same run id runs the cell again. `record`: what the cell did, if it ran."""
    what = f" (it ran: {record['verdict']}{': ' + record['reason'] if record.get('reason') else ''})" if record else ""
    reason = f"the harness could not write this cell's files: {err.strerror or err} ({err.filename}){what}"
    return check_judged({**base_record(task, run_id), "status": "error", "verdict": "error", "reason": reason,
                         "expectations": [], "tags": list(task.cell.case.tags)}, f"the record of {task.key}")


def judged_record(task: Task, settings: RunSettings, processes: CellProcesses,
                  extra_env: dict[str, str] | None = None, launcher: Launcher | None = None,
                  fresh_first: str | None = None, confirmations: Confirmations | None = None,
                  fresh: FreshProcess | None = None, built: dict[str, Path] | None = None) -> JudgedRecord:
    """The judged record of one task: a skip, or its cell run (again, `retries` times, while it fails). A cell
    that a warm worker ran to anything but a pass is run again in a fresh process, and that run is the record:
    a worker polluted by an earlier cell can never decide a verdict. Only an expected failure that a fresh
    process of this run already showed for the same case (`confirmations`) is taken from the worker as it is.
    The worker itself goes on after a Python exception (it retired or died by itself after anything harder:
    harness/run/process/launch.py). A cell expected not to pass (`fresh_first` says why: a waiver, the last run) starts
    in a fresh process while no cell of its case expected to fail for that reason has been confirmed yet: its warm
    run would only be repeated. `built`: the models the run built so far, by name, which this cell adds what it
    builds to (the run's own, never its settings'; default: a copy of the settings' `built`, for this cell alone)."""
    reason = not_run_reason(task, settings)
    if reason:
        return skip_record(task, reason, settings.run_dir.root.name)
    built = dict(settings.built) if built is None else built
    if not settings.use_hub:
        ensure_models(task, settings.models, settings.cache_dir / "models", built)
    # `fresh`: the run's fresh processes. One forked from a template is fresh as a confirmation needs: it has
    # imported torch and vLLM (as every cell's import phase does) but never built an engine, so no earlier cell's
    # engine, compiled graphs or teardown can have left anything behind in it.
    fresh = fresh or FreshProcess(settings.cell_command)
    starts_fresh = fresh_first is not None and bool(fresh_first) and not (
        confirmations is not None and confirmations.has_group(task.cell.case.name, fresh_first))
    launcher = fresh if launcher is None or starts_fresh else launcher
    record = run_attempt(task, settings, processes, launcher, extra_env, built=built)
    if processes.stopping:  # an interrupted run keeps no record of a cell it killed: no fresh run, no retry
        return record
    facts: OutcomeRecord = {}  # how the run came to its record: the runner's facts, judged with the outcome
    if launcher.isolation != fresh.isolation and _needs_fresh_process(record):
        confirmed_by = confirmations.confirmed_by(record) if confirmations is not None else None
        if confirmed_by:
            facts["confirmed_by"] = confirmed_by
        else:
            warm = record
            record = run_attempt(task, settings, processes, fresh, extra_env, built=built)
            facts["warm_attempt"] = warm_attempt(warm)
            launcher = fresh
    retries = task.cell.case.retries
    while (attempt := unwaived(record))["verdict"] in FAILING_VERDICTS and retries > 0:
        retries -= 1
        record = run_attempt(task, settings, processes, launcher, extra_env, first_failure=attempt["reason"],
                             built=built)
    if starts_fresh and fresh_first:
        facts["fresh_first"] = fresh_first
    if facts:  # the record is the judgement of everything it holds: judging it again gives it back
        record = judged({**outcome_of(record), **facts}, task, settings)
    if confirmations is not None:
        confirmations.add(record, fresh_first)
    return record


def expected_not_to_pass(task: Task, settings: RunSettings, last_verdicts: dict[str, str] | None) -> str | None:
    """Why a cell is expected not to pass here, for a warm run to start it in a fresh process: its case expects
    a failure on this class and vLLM (a `crash:` rule) or an accuracy drop, a waiver matches it (cell, class, vLLM
    version), or its class's last run gave it a verdict other than pass or skip."""
    context = task.context(settings.vllm_version)
    crash = next((rule.crash for rule in task.cell.case.expect
                  if isinstance(rule.crash, CrashExpected) and when_matches(rule.when, context)), None)
    if crash is not None:
        return f"the case expects failure {crash.signature}"
    # An expected accuracy drop is an xfail too: its cell would run twice (in a worker, then again fresh), and as
    # the eager oracle of the case's compiled cell (on the H200 with vLLM 0.33.0) the oracle ran twice.
    accuracy = task.cell.case.accuracy
    drop = next((d for d in (accuracy.expected_drops if accuracy else []) if when_matches(d.when, context)), None)
    if drop is not None:
        return f"the case expects an accuracy drop ({drop.reason})"
    waiver = next((w for w in settings.waivers
                   if w.matches(task.cell.cell_id, task.gpu_name, settings.vllm_version)), None)
    if waiver is not None:
        return f"waived ({waiver.link})"
    last = (last_verdicts or {}).get(task.cell.cell_id)
    return f"{last} in the last run" if last not in (None, "pass", "skip") else None


def warm_attempt(warm: JudgedRecord) -> WarmAttempt:
    """What a record keeps of the warm worker's attempt when a fresh process ran the cell again."""
    return WarmAttempt(status=warm.get("status"), verdict=warm.get("verdict"), signature=warm.get("signature"),
                       signal=warm.get("signal"), error_tail=warm.get("error_tail"), reason=warm.get("reason"),
                       worker=warm.get("worker"), timings=warm.get("timings"))


def _needs_fresh_process(record: JudgedRecord) -> bool:
    """Anything but a pass (before waivers) or a clean refusal the case expects: a failure, an xfail, an error,
    a timeout, a kill or a signal."""
    return (unwaived(record)["verdict"] not in ("pass", "skip")
            or record.get("status") not in ("ok", "crash") or bool(record.get("signal")))
