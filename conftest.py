"""pytest front end over the matrix: `pytest cases/ -k ct-llama` runs those cells, `pytest cases/ -n 4` spreads
them over xdist workers. Each case file is collected as a file of items, one per cell (the pattern of pytest's
"Working with non-python tests"); each item runs its cell through the same harness as `kvmatrix run`, into the
same results folder, judged the same way (the case's expectations and the known failures of cases/_waivers.txt,
harness/judge/judge.py), behind the same guard (a results folder made with other case files is refused), so a
pytest run and a `kvmatrix run` with the same run id resume each other and give the same verdicts.

The harness's own tests live in tests/ and do not collect cells.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RUNS_DIR
from kvmatrix.harness.record.parts import FAILING_VERDICTS
from kvmatrix.harness.run.guards import GuardError, cases_dir_for, claim_run_folder
from kvmatrix.harness.run.pool import run_tasks
from kvmatrix.harness.run.session import Session, open_session, vllm_vocabulary
from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.load import load_case
from kvmatrix.matrix.schema import CaseError


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvmatrix")
    group.addoption("--gpu", help="GPU class to run cells as (default: this machine's)")
    group.addoption("--emulate", action="store_true", help="emulate --gpu's decisions on this machine's GPU")
    group.addoption("--run-id", help="results folder under reports/runs/ (the same id resumes)")
    group.addoption("--force", action="store_true", help="resume a results folder made with other case files")
    group.addoption("--cases-dir", help="folder of case files to collect (default: the one the --run-id folder "
                                        "was made with, else the built-in cases)")


def _cases_dir(config: pytest.Config) -> Path:
    """The folder whose case files are collected, as `kvmatrix run` picks it (a resumed run keeps its cases)."""
    run_id = config.getoption("--run-id")
    return cases_dir_for(config.getoption("--cases-dir"), RUNS_DIR / run_id if run_id else None).resolve()


def _session(config: pytest.Config) -> Session:
    if not hasattr(config, "_kvmatrix_session"):
        cases_dir = _cases_dir(config)
        session = open_session(gpu=config.getoption("--gpu"), emulate=config.getoption("--emulate"),
                               run_id=config.getoption("--run-id"), cases_dir=cases_dir)
        try:
            claim_run_folder(session.run_dir.root, cases_dir, config.getoption("--force"))
        except GuardError as err:
            raise pytest.UsageError(str(err)) from None
        config._kvmatrix_session = session
    return config._kvmatrix_session


def pytest_collect_file(parent: pytest.Collector, file_path):
    if file_path.suffix == ".yaml" and file_path.parent.resolve() == _cases_dir(parent.config) \
            and not file_path.name.startswith("_"):
        return CaseFile.from_parent(parent, path=file_path)
    return None


class CaseFile(pytest.File):
    def collect(self):
        session = _session(self.config)
        case = load_case(self.path, vllm_vocabulary(session.settings.models))
        cells = expand_case(case, session.settings.models, session.pool, str(self.path))
        for task in session.tasks(cells):
            yield CellItem.from_parent(self, name=task.cell.cell_id, task=task)


class CellFailed(Exception):
    pass


def report_verdict(record: dict) -> None:
    """A record's verdict as pytest's outcome: skip, xfail, a failure (fail and error), or a pass."""
    if record["verdict"] == "skip":
        pytest.skip(record["reason"])
    if record["verdict"] == "xfail":
        pytest.xfail(record["reason"])
    if record["verdict"] in FAILING_VERDICTS:
        raise CellFailed(record)


class CellItem(pytest.Item):
    def __init__(self, *, task, **kwargs):
        super().__init__(**kwargs)
        self.task = task

    def runtest(self) -> None:
        session = _session(self.config)
        session.build_models([self.task])
        # A cell spanning several GPUs takes them whole, as under `kvmatrix run`.
        (record,) = run_tasks([self.task], session.settings, devices=session.settings.gpus_here or 0,
                              ranks_env=session.ranks_env)
        self.user_properties.append(("record", str(session.run_dir.record_path(self.task.cell.cell_id,
                                                                              self.task.gpu_name))))
        report_verdict(record)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CellFailed):
            record = excinfo.value.args[0]
            lines = [f"{record['verdict'].upper()}: {record['reason']}"]
            lines += [f"  {'ok ' if r['ok'] else 'NOT'} {r['detail']}   <- {r['rule']}" for r in record["expectations"]]
            if record.get("log"):
                lines.append(f"  log: {record['log']}")
            return "\n".join(lines)
        if isinstance(excinfo.value, CaseError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"cell {self.name} @{self.task.gpu_name}"
