"""One run plan (harness/run/plan.py) for both front ends: made once, frozen, with the canary on, the cases loaded
once (the waivers file lent or not decided there), the slots shared among pytest-xdist's workers, and what earlier
runs saw read once (the history through the front end's reader, else the last run on these caches, and a history
that cannot be read costs only the order). Cases are the fake-able ones of tests/conftest.py; nothing runs."""

from __future__ import annotations

import dataclasses
import pickle
import sqlite3
from pathlib import Path

import pytest

from kvmatrix.harness.run.cases import CaseSelection
from kvmatrix.harness.run.last_run import last_run_file, remember
from kvmatrix.harness.run.order.policy import PastRuns
from kvmatrix.harness.run.plan import RunOptions, narrowed, plan_run
from kvmatrix.harness.run.task.runner import base_record
from tests.conftest import CPU_CLASS

OK_AUTO = "ok[kv=auto,skip=-,spec=-]"


def options(cases_dir: Path, tmp_path: Path, **asked) -> RunOptions:
    return RunOptions(gpu=CPU_CLASS, runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache", cases_dir=cases_dir,
                      run_id="planned", **asked)


def test_a_plan_is_final_and_runs_the_canary(matrix_with_waiver, tmp_path):
    plan = plan_run(options(matrix_with_waiver, tmp_path, selection=CaseSelection(cases=("ok",))), claim=False)
    assert plan.settings.canary and plan.settings.isolation == "worker"
    assert [t.cell.cell_id for t in plan.tasks] == [c.cell_id for c in plan.cases.selected]
    assert {c.case.name for c in plan.cases.every} > {"ok"} and plan.cases.invalid == ()
    assert not plan.cases.waivers_lent  # the folder has its own _waivers.txt
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.settings = plan.settings  # type: ignore[misc]
    assert not (tmp_path / "runs" / "planned").exists()  # a listing (claim=False) makes no run folder


def test_a_folder_without_waivers_borrows_the_default_ones(matrix_with_waiver, tmp_path):
    (matrix_with_waiver / "_waivers.txt").unlink()
    plan = plan_run(options(matrix_with_waiver, tmp_path), claim=False)
    assert plan.cases.waivers_lent


def test_the_slots_are_the_jobs_asked_or_the_machines_shared_among_workers(matrix_with_waiver, tmp_path):
    whole = plan_run(options(matrix_with_waiver, tmp_path), claim=False).slots.count
    assert plan_run(options(matrix_with_waiver, tmp_path, jobs=3), claim=False).slots.count == 3
    shared = plan_run(options(matrix_with_waiver, tmp_path, shared_by=2), claim=False).slots.count
    assert shared == max(1, whole // 2)


def test_earlier_runs_are_read_once_from_the_history_else_the_caches(matrix_with_waiver, tmp_path, capsys):
    db = tmp_path / "history.sqlite"
    db.touch()
    timed = PastRuns({OK_AUTO: 12.0}, {OK_AUTO: "fail"}, {OK_AUTO: "CPU_ATTN"})
    plan = plan_run(options(matrix_with_waiver, tmp_path, history_db=db), lambda path, gpu: timed, claim=False)
    assert plan.past == timed

    settings = plan.settings
    remember(last_run_file(settings.cache_dir, CPU_CLASS, settings.vllm_version),
             {"cell_id": OK_AUTO, "verdict": "pass", "timings": {"total_s": 3.0}, "layers": []})

    def unreadable(path, gpu):
        raise sqlite3.DatabaseError("file is not a database")

    plan = plan_run(options(matrix_with_waiver, tmp_path, history_db=db), unreadable, claim=False)
    assert plan.past == PastRuns({OK_AUTO: 3.0}, {OK_AUTO: "pass"}, {})  # the last run on these caches
    assert "could not be read (file is not a database); cells start in the cases' order" in capsys.readouterr().err


def test_the_plan_holds_the_start_order_and_its_canary(matrix_with_waiver, tmp_path):
    """The order is the plan's, made once before any cell starts: the canary (the plainest cell expected to pass)
    first; a front end's selection gets the order of its own tasks; a resumed run's recorded cells are not in it,
    and a record showing this environment starting an engine leaves no canary to run."""
    plan = plan_run(options(matrix_with_waiver, tmp_path), claim=False)
    order = plan.order
    assert order.canary is not None and order.canary.cell.cell_id == OK_AUTO and order.tasks[0] == order.canary
    assert {t.key for t in order.tasks} == {t.key for t in plan.tasks}
    others = [t for t in plan.tasks if t.cell.case.name == "crash"]
    narrow = narrowed(plan, others)
    assert narrow.tasks == tuple(others) and {t.key for t in narrow.order.tasks} == {t.key for t in others}
    assert narrow.order.canary is None or narrow.order.canary.cell.case.name == "crash"

    canary = order.canary
    plan.settings.run_dir.write({**base_record(canary, "planned"), "status": "ok", "verdict": "pass",
                                 "expectations": [], "tags": []})
    resumed = plan_run(options(matrix_with_waiver, tmp_path), claim=False)
    assert resumed.order.canary is None and canary.key not in {t.key for t in resumed.order.tasks}


def test_the_plans_contents_are_values(matrix_with_waiver, tmp_path):
    """Nothing a plan holds can change under the run: its settings' mappings refuse changes (and still travel to a
    Ray node, pickled), its waivers are a tuple, its pool and earlier runs read-only views, and no open file."""
    plan = plan_run(options(matrix_with_waiver, tmp_path), claim=False)
    settings = plan.settings
    for mapping in (settings.models, settings.built, settings.environment, plan.gpu_classes, plan.past.verdicts,
                    plan.order.waits):
        with pytest.raises(TypeError):
            mapping["planted"] = None  # type: ignore[index]
    with pytest.raises(TypeError):
        settings.built.update(llama=tmp_path)  # type: ignore[attr-defined]
    assert isinstance(settings.waivers, tuple)
    shipped = pickle.loads(pickle.dumps(settings))
    assert shipped.run_dir.root == settings.run_dir.root and dataclasses.replace(shipped, run_dir=settings.run_dir) \
        == settings and isinstance(shipped.models, type(settings.models))
    assert not any(hasattr(value, "fileno") for value in vars(plan).values())
