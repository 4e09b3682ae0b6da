"""What kvmatrix already knows fails on the installed vLLM, applied to a user's own cases: the built-in cases'
expected crashes that carry a link (`crash: {signature, link}`: AMX_MLA's fp8 assert on `cpu-amx`, ...) and the
built-in waivers (known vLLM bugs, each linked to its finding). A failure of a user's case that one of them
explains is that known failure, not an unexplained FAIL: `xfail`, with its link, what knows it and the rule to copy
into the case to expect it. Never hidden: an xfail is reported as one, and a failure nothing here explains stays a
FAIL.

A built-in crash rule explains a user's cell where the cell runs the same model (the same registry entry) in a
configuration (axes) one of the rule's case's cells has, the rule's `when:` holds for the cell, and the cell crashed
with the rule's signature (or a member of its family). A
built-in waiver explains it where it would waive the cell were it a built-in case's of the same model (the same
axes, on a class and vLLM release the waiver names).
The built-in cases judge their own cells themselves: this is for cases from elsewhere.

Judging reads no file: whoever knows the cells (the run's plan, `rejudge`, `audit`, `qualify`) reads what is known
once (`known_failures_for`: the built-in cases and waivers, and the model registry of each user case's folder) and
passes it in; `explain` only looks it up."""

from __future__ import annotations

import datetime
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvmatrix.harness.judge.waivers import WAIVERS_FILE, Waiver, load_waivers
from kvmatrix.harness.record.paths import PACKAGE_ROOT
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.record.types import JudgedRecord, KnownFailureNote
from kvmatrix.harness.vllm_compat import signature_matches
from kvmatrix.matrix.axes import AXES, AXIS_DEFAULTS
from kvmatrix.matrix.conditions import when_matches
from kvmatrix.matrix.expand import Cell, added_cells, expand_case
from kvmatrix.matrix.expectations import CrashExpected
from kvmatrix.matrix.load import CASES_DIR, load_cases, load_models, load_pool
from kvmatrix.matrix.schema import ModelEntry

# The project's own findings, shipped with kvmatrix: a link `reports/findings/README.md#name` is read there.
FINDINGS = PACKAGE_ROOT / "reports" / "findings" / "README.md"


@dataclass(frozen=True)
class KnownCrash:
    """A built-in case's expected crash with a link."""

    model: ModelEntry
    when: dict[str, Any]
    crash: CrashExpected
    source: str  # `cases/deepseek-mla.yaml expect.8`
    # The configurations (axes) of the case's cells: a rule says what it says of them only (a TP=2 case's rule
    # without a dtype in its `when:` speaks of its fp8 cells, the only ones it has).
    configurations: frozenset[tuple]


def configuration(axes: Any) -> tuple:
    return tuple(repr(axes.get(a, AXIS_DEFAULTS[a])) for a in AXES)


@dataclass(frozen=True)
class KnownFailures:
    """What kvmatrix knows fails, as judging is given it: the built-in cases' linked crashes, the built-in
    waivers, each built-in case's (model, name), the model registry each user case file's cells are judged by (by
    `Cell.source`; a built-in cell is not there, so nothing here applies to it), and the project's findings page
    where it is shipped."""

    crashes: tuple[KnownCrash, ...] = ()
    waivers: tuple[Waiver, ...] = ()
    cases: tuple[tuple[ModelEntry, str], ...] = ()
    registries: Mapping[str, Mapping[str, ModelEntry]] = field(default_factory=dict)
    findings_page: Path | None = None


NONE_KNOWN = KnownFailures()  # judging built-in cells only, or a caller that knows of none


@functools.cache
def _built_in() -> tuple[tuple[KnownCrash, ...], tuple[Waiver, ...], tuple[tuple[ModelEntry, str], ...]]:
    """The built-in cases' linked crashes, the built-in waivers, and each built-in case's (model, name): read once
    per process."""
    models, pool = load_models(), load_pool()
    cases = [case for case in load_cases() if case.model in models]
    crashes = tuple(KnownCrash(models[case.model], rule.when, rule.crash, f"cases/{case.name}.yaml expect.{i}",
                               _configurations(expand_case(case, models, pool)))
                    for case in cases for i, rule in enumerate(case.expect)
                    if isinstance(rule.crash, CrashExpected) and rule.crash.link)
    return crashes, tuple(load_waivers(WAIVERS_FILE, pool)), tuple((models[case.model], case.name) for case in cases)


def _configurations(cells: list[Cell]) -> frozenset[tuple]:
    """The configurations a case's rules speak of: its cells', less the model reference kvmatrix adds to a case
    that does not list it (a bf16 comparison, not one of the configurations its rules were written for: an fp8-only
    case's rule without a dtype in its `when:` is not a rule of bf16), unless it is also the eager oracle of one of
    the case's cells."""
    added = added_cells(cells)
    references = {cell.cell_id for cell in cells if cell.reference_for and cell.cell_id in added}
    oracles = {oracle for cell in cells if cell.cell_id not in references for _, oracle in cell.oracles}
    return frozenset(configuration(cell.axes) for cell in cells
                     if cell.cell_id not in references or cell.cell_id in oracles)


def known_failures_for(cells: Iterable[Cell]) -> KnownFailures:
    """What judging these cells is given: nothing for a set of built-in cells only (their own rules judge them),
    else the built-in knowledge and each user case file's registry (files read here, once)."""
    user_sources = sorted({cell.source for cell in cells if not is_built_in(cell)})
    if not user_sources:
        return NONE_KNOWN
    crashes, waivers, cases = _built_in()
    registries = {source: _registry(Path(source).resolve().parent) for source in user_sources}
    return KnownFailures(crashes, waivers, cases, registries, FINDINGS if FINDINGS.is_file() else None)


def is_built_in(cell: Cell) -> bool:
    """A cell of kvmatrix's own cases, which its own rules judge: from a file there, or named only as a built-in
    case (`cases/<name>.yaml`, what expanding the default case set without paths calls its cells' source)."""
    source = Path(cell.source or f"cases/{cell.case.name}.yaml")
    return source.resolve().is_relative_to(CASES_DIR.resolve()) or not source.exists()


def _when_of_cell(record: JudgedRecord, gpu: str) -> dict[str, Any]:
    """A `when:` that names this cell's configuration: its axes that are not at their defaults, and its class."""
    axes: dict[str, Any] = dict(record.get("axes") or {})
    return {**{a: axes[a] for a in AXES if a in axes and axes[a] != AXIS_DEFAULTS[a]}, "gpu": {"name": gpu}}


def _note(record: JudgedRecord, link: str, source: str, rule: dict[str, Any], page: Path | None) -> KnownFailureNote:
    # As case files write a rule: one key a line, each value in flow style.
    text = "\n".join(f"{'- ' if i == 0 else '  '}{key}: "
                     f"{yaml.safe_dump(value, default_flow_style=True, width=1000, sort_keys=False).strip()}"
                     for i, (key, value) in enumerate(rule.items()))
    note = KnownFailureNote(verdict=record["verdict"], link=link, source=source, rule=text + "\n")
    anchor = link.partition("#")[2]
    if link.startswith("reports/findings/README.md") and page is not None:
        note["page"] = f"{page}#{anchor}" if anchor else str(page)
    return note


def _by_crash_rule(record: JudgedRecord, task: Task, model: ModelEntry, context: dict, known_failures: KnownFailures
                   ) -> KnownFailureNote | None:
    for known in known_failures.crashes:
        if (known.model == model and configuration(task.cell.axes) in known.configurations
                and signature_matches(known.crash.signature, record.get("signature"))
                and when_matches(known.when, context)):
            rule = {"when": known.when, "crash": known.crash.model_dump(exclude_none=True)} if known.when else \
                {"crash": known.crash.model_dump(exclude_none=True)}
            return _note(record, str(known.crash.link), known.source, rule, known_failures.findings_page)
    return None


def _by_waiver(record: JudgedRecord, task: Task, model: ModelEntry, today: datetime.date,
               known_failures: KnownFailures) -> KnownFailureNote | None:
    """A built-in waiver that would waive this cell were it a cell of a built-in case of the same model: the same
    configuration (the cell id's axes) on the class and vLLM release the waiver names."""
    axes = task.cell.cell_id.partition("[")[2]
    as_built_in = [f"{name}[{axes}" for entry, name in known_failures.cases if entry == model]
    for waiver in known_failures.waivers:
        if waiver.expired(today) or not any(waiver.matches(cell_id, task.gpu_name, record.get("vllm_version"))
                                            for cell_id in as_built_in):
            continue
        rule: dict[str, Any]
        if record.get("signature"):
            rule = {"when": _when_of_cell(record, task.gpu_name),
                    "crash": {"signature": record["signature"], "link": waiver.link}}
        else:  # a check that failed, not a crash: a waiver line for the folder's own _waivers.txt
            rule = {"waiver": f"{record['cell_id']} gpu={task.gpu_name}"
                              + (f" vllm={waiver.vllm}" if waiver.vllm else "") + f" {waiver.link}"}
        return _note(record, waiver.link, f"cases/_waivers.txt:{waiver.line}", rule, known_failures.findings_page)
    return None


@functools.cache
def _registry(cases_dir: Path) -> dict[str, ModelEntry]:
    return load_models(cases_dir)


def explain(record: JudgedRecord, task: Task, known_failures: KnownFailures, today: datetime.date) -> JudgedRecord:
    """The record with a failure that kvmatrix already knows for this vLLM made `xfail`, naming it; else as it is.
    Only a FAIL of a case that is not built in (an error is the environment's or the harness's, never explained
    here), whose model is judged by its folder's registry."""
    models = known_failures.registries.get(task.cell.source)
    if record["verdict"] != "fail" or models is None or task.cell.model not in models:
        return record
    model, context = models[task.cell.model], task.context(record.get("vllm_version"))
    note = (_by_crash_rule(record, task, model, context, known_failures) if record.get("status") == "crash"
            else None) or _by_waiver(record, task, model, today, known_failures)
    if note is None:
        return record
    return {**record, "verdict": "xfail", "known_failure": note,
            "reason": f"known vLLM failure ({note['link']}, as kvmatrix's {note['source']} knows it): "
                      f"{record.get('reason', '')}"}
