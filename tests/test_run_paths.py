"""Every command that runs cells runs them the one way: `plan_run(options)` → `execute(plan)` (harness/run/plan.py),
so that each gets the same settings, start order, canary and executor choice. `kvmatrix run`, the pytest front end
and a bisection step (`python -m kvmatrix.harness.bisect.cell`, what `kvmatrix bisect`, `pr`'s base and head and
`qualify`'s bisections run in each environment; `qualify`'s two sides are `kvmatrix run` itself) are each followed
to the executor here, which records who called it instead of starting cells."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvmatrix.harness import cli
from kvmatrix.harness.bisect import cell as bisect_cell
from kvmatrix.harness.record.files import RUNS_DIR
from kvmatrix.harness.run.executor.local import LocalExecutor
from tests.conftest import CPU_CLASS
from tests.test_front_ends import run_pytest_front_end

OK_CELL = "ok[kv=auto,skip=-,spec=-]"


@pytest.fixture
def executed(monkeypatch) -> list[dict]:
    """Each call of this machine's executor: the functions it was called through, its cells and settings."""
    calls: list[dict] = []

    def spy(self, tasks, order, settings, on_record=None):
        frame, callers = sys._getframe(1), []
        while frame is not None:
            callers.append(f"{frame.f_globals.get('__name__')}.{frame.f_code.co_name}")
            frame = frame.f_back
        calls.append({"callers": callers, "cells": [t.cell.cell_id for t in tasks], "settings": settings,
                      "order": order})
        return []

    monkeypatch.setattr(LocalExecutor, "run", spy)
    return calls


def _through_the_plan(call: dict) -> bool:
    return "kvmatrix.harness.run.plan.execute" in call["callers"]


def test_kvmatrix_run_executes_its_plan(matrix_with_waiver, tmp_path, executed):
    cli.main(["run", "--cases-dir", str(matrix_with_waiver), "--runs-dir", str(tmp_path / RUNS_DIR), "--run-id", "r",
              "--cache-dir", str(tmp_path / "cache"), "--db", str(tmp_path / "none.sqlite"), "--gpu", CPU_CLASS,
              "--case", "ok"])
    (call,) = executed
    assert _through_the_plan(call) and "kvmatrix.harness.cli.run.cmd_run" in call["callers"]
    assert OK_CELL in call["cells"] and call["settings"].canary


def test_the_pytest_front_end_executes_its_plan(matrix_with_waiver, tmp_path, monkeypatch, executed):
    run_pytest_front_end(matrix_with_waiver, tmp_path, monkeypatch, "--kvmatrix-run-id", "p", "-k", "ok")
    (call,) = executed
    assert _through_the_plan(call) and "kvmatrix.harness.cli.pytest_plugin.run" in call["callers"]
    assert OK_CELL in call["cells"] and call["settings"].canary


def test_a_bisection_step_executes_its_plan(matrix_with_waiver, tmp_path, executed):
    """A step's cells, found in its own environment's case files, judged without waivers (the raw verdict is what
    a bisection compares) and without a canary, in one slot."""
    answer = bisect_cell.run([OK_CELL, "nosuch[kv=auto]"], tmp_path / "steps", "v1", tmp_path / "cache",
                             gpu=CPU_CLASS, isolation="worker", cases_dir=matrix_with_waiver)
    (call,) = executed
    assert _through_the_plan(call) and "kvmatrix.harness.bisect.cell.run" in call["callers"]
    settings = call["settings"]
    assert call["cells"] == [OK_CELL] and call["order"].canary is None
    assert list(settings.waivers) == [] and not settings.canary and settings.isolation == "worker"
    assert settings.run_dir.root == Path(tmp_path / "steps" / "v1")
    assert list(answer["skips"]) == ["nosuch[kv=auto]"] and answer["records"] == {}


@pytest.fixture
def fake_cells(monkeypatch):
    """Plans whose cells and workers are the fake ones of tests/test_front_ends.py (no vLLM)."""
    from dataclasses import replace

    from kvmatrix.harness.run import plan as run_plan
    from tests.test_front_ends import FAKE_CELL, FAKE_WORKER

    opened = run_plan.open_session

    def faked(*args, **kwargs):
        session = opened(*args, **kwargs)
        session.settings = replace(session.settings, cell_command=FAKE_CELL, worker_command=FAKE_WORKER)
        return session

    monkeypatch.setattr(run_plan, "open_session", faked)


@pytest.mark.usefixtures("fake_cells")
def test_what_a_run_builds_is_its_own_not_its_plans(matrix_with_waiver, tmp_path):
    """The models a run builds as its cells start reach its cells (their engine arguments name the build) but
    never the plan, whose settings stay as `plan_run` made them."""

    from kvmatrix.harness.run import plan as run_plan
    from kvmatrix.harness.run.cases import CaseSelection

    plan = run_plan.plan_run(run_plan.RunOptions(
        gpu=CPU_CLASS, runs_dir=tmp_path / RUNS_DIR, cache_dir=tmp_path / "cache", cases_dir=matrix_with_waiver,
        selection=CaseSelection(cells=(OK_CELL,)), template=False), say=lambda line: None)
    (record,) = run_plan.execute(plan)
    assert record["verdict"] == "pass"
    assert Path(record["engine_args"]["model"]).parent == tmp_path / "cache" / "models"  # built by this run
    assert plan.settings.built == {}


@pytest.mark.usefixtures("fake_cells")
def test_the_local_executor_starts_cells_in_the_plans_order(matrix_with_waiver, tmp_path, monkeypatch):
    """The executor builds no order of its own: given a plan whose order is the reverse of the one planned (no
    canary, nothing waiting), one slot starts the cells in exactly that order."""
    from dataclasses import replace

    from kvmatrix.harness.run import plan as run_plan

    plan = run_plan.plan_run(run_plan.RunOptions(
        gpu=CPU_CLASS, runs_dir=tmp_path / RUNS_DIR, cache_dir=tmp_path / "cache", cases_dir=matrix_with_waiver,
        jobs=1, template=False), say=lambda line: None)
    assert plan.order.canary is not None and plan.order.tasks[0] == plan.order.canary
    reverse = tuple(reversed(plan.order.tasks))
    planted = replace(plan, order=replace(plan.order, tasks=reverse, canary=None,
                                          waits={t.key: frozenset() for t in reverse}))
    finished: list[str] = []
    run_plan.execute(planted, lambda record, *_: finished.append(record["cell_id"]))
    assert finished == [t.cell.cell_id for t in reverse]
