"""kvmatrix as a pytest plugin (entry point `pytest11`, so it is there wherever kvmatrix is installed):
`pytest --kvmatrix-cases mine` collects each case file of `mine/` as a file of items, one per cell on this machine's
class (the pattern of pytest's "Working with non-python tests"), and pytest's own selection (`-k`, `--deselect`,
`-m`) picks among them. The selected cells then run as one `kvmatrix run` does, in the same code: this machine's
slots, warm workers (a cell that does not pass again in a fresh process), the canary, the same judging, waivers and
known failures, and the same run folder with its reports and findings pages; each item reports its cell's verdict
(pass, skip, xfail, or a failure for fail and error). A run starts in a new folder; `--kvmatrix-resume [RUN_ID]`
or `--kvmatrix-run-id` goes on with one, as `kvmatrix run` does and with it.

Without `--kvmatrix-cases` the plugin collects nothing, unless a conftest names default cases
(`config.kvmatrix_default_cases`: kvmatrix's checkout does, so `pytest cases/` runs the built-in ones). Nothing
heavy is imported until a case file is collected: other test suites of the environment pay nothing for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from kvmatrix.harness.record.task import Task
    from kvmatrix.harness.record.types import JudgedRecord
    from kvmatrix.harness.run.plan import RunOptions, RunPlan

RUN = pytest.StashKey["KvmatrixRun"]()
RUN_ID_FOR_WORKERS = "kvmatrix_run_id"  # xdist: the run folder every worker writes, chosen by the controller


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvmatrix", "kvmatrix: vLLM KV-cache configurations as test items")
    group.addoption("--kvmatrix-cases", metavar="DIR", help="run the cells of this folder's case files")
    group.addoption("--kvmatrix-gpu", metavar="CLASS", help="GPU class to run cells as (default: this machine's)")
    group.addoption("--kvmatrix-emulate", action="store_true", help="emulate --kvmatrix-gpu's decisions here")
    group.addoption("--kvmatrix-run-id", metavar="RUN_ID",
                    help="results folder under --kvmatrix-runs-dir; an existing one is resumed (default: a new one)")
    group.addoption("--kvmatrix-resume", nargs="?", const="latest", metavar="RUN_ID",
                    help="go on with an earlier run (RUN_ID, or `latest`, the default)")
    group.addoption("--kvmatrix-runs-dir", default=None, metavar="DIR", help="where run folders go (reports/runs)")
    group.addoption("--kvmatrix-cache-dir", default=None, metavar="DIR", help="built models and compile caches")
    group.addoption("--kvmatrix-isolation", choices=("worker", "process"), default="worker",
                    help="worker: warm workers, as kvmatrix run; process: a fresh process per cell")
    group.addoption("--kvmatrix-jobs", type=int, default=0, metavar="N", help="cells at once (default: the slots)")
    group.addoption("--kvmatrix-force", action="store_true",
                    help="resume a results folder made with other case files")


def cases_dir(config: pytest.Config) -> Path | None:
    """The folder whose case files are collected: --kvmatrix-cases, else the one a resumed run was made with,
    else a conftest's default (kvmatrix's checkout: its built-in cases); None: collect no cells."""
    given = config.getoption("kvmatrix_cases")
    if given:
        return Path(given).resolve()
    resumed = config.getoption("kvmatrix_run_id") or config.getoption("kvmatrix_resume")
    if resumed and resumed != "latest":
        from kvmatrix.harness.record.files import RUNS_DIR
        from kvmatrix.harness.run.guards import recorded_cases_dir

        runs = Path(config.getoption("kvmatrix_runs_dir") or RUNS_DIR)
        if (runs / resumed).is_dir():
            return recorded_cases_dir(runs / resumed).resolve()
    default = getattr(config, "kvmatrix_default_cases", None)
    return Path(default).resolve() if default else None


def run_options(config: pytest.Config) -> RunOptions:
    """This pytest run's options as `kvmatrix run`'s (the same defaults); pytest's own -k selects among the cells."""
    from kvmatrix.harness.record.files import RUNS_DIR
    from kvmatrix.harness.record.paths import DEFAULT_CACHE
    from kvmatrix.harness.results.history import DEFAULT_DB
    from kvmatrix.harness.run.plan import RunOptions

    run_id = getattr(config, "workerinput", {}).get(RUN_ID_FOR_WORKERS) or config.getoption("kvmatrix_run_id")
    workers = getattr(config, "workerinput", {}).get("workercount")
    return RunOptions(
        gpu=config.getoption("kvmatrix_gpu"), emulate=config.getoption("kvmatrix_emulate"), run_id=run_id,
        resume=None if run_id else config.getoption("kvmatrix_resume"), cases_dir=cases_dir(config),
        isolation=config.getoption("kvmatrix_isolation"), jobs=config.getoption("kvmatrix_jobs"),
        shared_by=int(workers or 1),  # xdist: the machine's slots shared among its workers
        runs_dir=Path(config.getoption("kvmatrix_runs_dir") or RUNS_DIR),
        cache_dir=Path(config.getoption("kvmatrix_cache_dir") or DEFAULT_CACHE), history_db=DEFAULT_DB,
        force=config.getoption("kvmatrix_force"))


class KvmatrixRun:
    """This pytest run's kvmatrix run: planned as `kvmatrix run` plans one, its selected cells run by the same
    executor before the items report, and finished (waivers, reports, findings) at the session's end."""

    def __init__(self, config: pytest.Config):
        from kvmatrix.harness.cli import usage_errors
        from kvmatrix.harness.finish import history_of
        from kvmatrix.harness.run.host import host_cpu
        from kvmatrix.harness.run.plan import plan_run

        self.config, self.say = config, terminal_line(config)
        self.started = host_cpu.reading()
        try:
            # Invalid case files are collection errors of their own; a listing makes no run folder.
            self.plan: RunPlan = plan_run(run_options(config), history_of, say=lambda line: None,
                                          claim=not config.option.collectonly)
        except usage_errors() as err:  # what `kvmatrix run` says in one line, exit 2
            raise pytest.UsageError(str(err)) from None
        self.records: dict[str, JudgedRecord] = {}
        self.ran: list[JudgedRecord] = []

    def tasks_of(self, path: Path) -> list[Task]:
        return [t for t in self.plan.tasks if Path(t.cell.source).resolve() == path.resolve()]

    def invalid_of(self, path: Path) -> Any:
        return next((err for err in self.plan.cases.invalid if Path(err.file).resolve() == path.resolve()), None)

    def run(self, tasks: list[Task]) -> None:
        from kvmatrix.harness.finish import first_line, progress_printer
        from kvmatrix.harness.record.files import record_stem
        from kvmatrix.harness.run.order.canary import EnvironmentBroken
        from kvmatrix.harness.run.plan import execute, narrowed

        self.say(first_line(self.plan, len(tasks)))
        try:
            self.ran = execute(narrowed(self.plan, tasks), progress_printer(self.started.at, self.say))
        except EnvironmentBroken as err:  # the canary: nothing recorded, one line, as `kvmatrix run` says it
            pytest.exit(f"kvmatrix: {err}", returncode=pytest.ExitCode.USAGE_ERROR)
        self.records = {record_stem(r["cell_id"], r["gpu_class"]): r for r in self.ran}

    def finish(self) -> bool:
        """The run's end, as `kvmatrix run` ends one; whether it failed."""
        from kvmatrix.harness.finish import finish_run

        return finish_run(self.plan, self.ran, self.started, say=self.say, show_report=False)


def terminal_line(config: pytest.Config):
    """A line on pytest's terminal (output of the session's own hooks is otherwise captured)."""
    def say(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(line)
    return say


def _run(config: pytest.Config) -> KvmatrixRun:
    if RUN not in config.stash:
        config.stash[RUN] = KvmatrixRun(config)
    return config.stash[RUN]


def pytest_configure(config: pytest.Config) -> None:
    """`pytest --kvmatrix-cases mine` with no paths of its own collects that folder (not the testpaths)."""
    folder = config.getoption("kvmatrix_cases")
    if folder and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(folder)]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: every worker writes the run folder the controller chose (a new run is one folder, not one per
    worker); the controller renders its reports at the end."""
    config = node.config
    if cases_dir(config) is None:
        return
    node.workerinput[RUN_ID_FOR_WORKERS] = _run(config).plan.settings.run_dir.root.name


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.Collector | None:
    folder = cases_dir(parent.config) if file_path.suffix == ".yaml" else None
    if folder is not None and file_path.parent.resolve() == folder and not file_path.name.startswith("_"):
        return CaseFile.from_parent(parent, path=file_path)
    return None


class CaseFile(pytest.File):
    def collect(self):
        run = _run(self.config)
        invalid = run.invalid_of(self.path)
        if invalid is not None:  # a collection error naming file, case and field; the other files still collect
            raise self.CollectError(str(invalid))
        for task in run.tasks_of(self.path):
            yield CellItem.from_parent(self, name=task.cell.cell_id, task=task)


class CellFailed(Exception):
    pass


def report_verdict(record: JudgedRecord) -> None:
    """A record's verdict as pytest's outcome: skip, xfail, a failure (fail and error), or a pass."""
    from kvmatrix.harness.record.parts import FAILING_VERDICTS

    if record["verdict"] == "skip":
        pytest.skip(record["reason"])
    if record["verdict"] == "xfail":
        pytest.xfail(record["reason"])
    if record["verdict"] in FAILING_VERDICTS:
        raise CellFailed(record)


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session):
    """The selected cells run before their items report, all at once on this machine's slots (warm workers), as
    `kvmatrix run` runs them."""
    cells = [item for item in session.items if isinstance(item, CellItem)]
    # pytest itself stops after collection errors (unless --continue-on-collection-errors): run nothing then.
    stops = session.testsfailed and not session.config.option.continue_on_collection_errors
    if cells and not session.config.option.collectonly and not stops:
        _run(session.config).run([item.task for item in cells])
    return (yield)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The run folder's reports and findings, once: by the process that ran the cells, or (xdist) the controller
    over every worker's records."""
    config = session.config
    if RUN not in config.stash or config.option.collectonly:
        return
    run = config.stash[RUN]
    if not run.ran and not hasattr(config, "workerinput"):  # xdist's controller: the workers ran the cells
        from kvmatrix.harness.record.files import RunDir

        run.ran = RunDir(run.plan.settings.run_dir.root).records()
    if hasattr(config, "workerinput") or not run.ran:
        return
    if run.finish() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a waiver problem (expired, of no cell)


class CellItem(pytest.Item):
    def __init__(self, *, task: Task, **kwargs: Any):
        super().__init__(**kwargs)
        self.task = task

    def runtest(self) -> None:
        run = _run(self.config)
        record = run.records.get(self.task.key)
        if record is None:
            raise CellFailed({"verdict": "error", "reason": "the run did not record this cell", "expectations": []})
        self.user_properties.append(("record", str(run.plan.settings.run_dir.record_path(
            self.task.cell.cell_id, self.task.gpu_name))))
        self.user_properties.append(("seconds", (record.get("timings") or {}).get("total_s")))
        report_verdict(record)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CellFailed):
            record = excinfo.value.args[0]
            lines = [f"{record['verdict'].upper()}: {record['reason']}"]
            lines += [f"  {'ok ' if r['ok'] else 'NOT'} {r['detail']}   <- {r['rule']}" for r in record["expectations"]]
            if record.get("log"):
                lines.append(f"  log: {record['log']}")
            return "\n".join(lines)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"cell {self.name} @{self.task.gpu_name}"
