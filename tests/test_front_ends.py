"""`pytest` (the kvmatrix plugin) and `kvmatrix run` give a cell the same verdict: the same fake cells
(tests/fake_cell.py, the real cell protocol) through both front ends, with a case's expected crash, a skip rule and a
waiver of the folder's _waivers.txt, each into its own results folder, through the same pool (warm workers) and
with the same reports; the plugin refuses a results folder made with other case files, as `kvmatrix run` does, and
`pytest cases/` in this checkout still collects the built-in cases."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvmatrix.harness import cli
from kvmatrix.harness.record.files import RUNS_DIR, RunDir
from kvmatrix.harness.run import plan as run_plan
from tests.conftest import CPU_CLASS, KNOWN_LINK, write_case

REPO = Path(__file__).resolve().parent.parent
FAKE_CELL = (sys.executable, str(REPO / "tests" / "fake_cell.py"))
FAKE_WORKER = (sys.executable, str(REPO / "tests" / "fake_worker.py"))
PLUGIN = "kvmatrix.harness.cli.pytest_plugin"  # its entry point's name too: `-p` never registers it twice
# pytest's outcome for each verdict (fail and error both fail the item).
OUTCOME = {"pass": "passed", "skip": "skipped", "xfail": "xfailed", "fail": "failed", "error": "failed"}


def fake_sessions(open_session, cases_dir: Path, tmp_path: Path):
    """`open_session` with fake cells, no model build and the test's runs and cache folders."""

    def fake(*args, **kwargs):
        if "runs_dir" not in kwargs:
            kwargs.update(runs_dir=tmp_path / RUNS_DIR, cache_dir=tmp_path / "cache")
        session = open_session(*args, **kwargs)
        # Fake cells in fresh processes and in warm workers alike: real vLLM here would judge by this CPU's kind.
        session.settings = replace(session.settings, cell_command=FAKE_CELL, worker_command=FAKE_WORKER)
        session.build_models = lambda tasks: session.settings.built.update(llama=cases_dir)
        return session

    return fake


def run_pytest_front_end(cases_dir: Path, tmp_path: Path, monkeypatch, *args: str, name_cases_dir: bool = True
                         ) -> tuple[int, dict[str, str]]:
    """`pytest --kvmatrix-cases` over `cases_dir` in this process: (exit code, cell id → pytest outcome). Without
    `name_cases_dir`, the plugin finds the folder itself (the one its --kvmatrix-run-id was made with)."""
    if name_cases_dir:
        args = ("--kvmatrix-cases", str(cases_dir), *args)
    monkeypatch.setattr(run_plan, "open_session", fake_sessions(run_plan.open_session, cases_dir, tmp_path))
    outcomes: dict[str, str] = {}

    class Outcomes:
        def pytest_runtest_logreport(self, report):
            cell_id = report.nodeid.split("::")[-1]
            if report.when == "call" or report.outcome != "passed":
                outcomes[cell_id] = "xfailed" if hasattr(report, "wasxfail") else report.outcome

    code = pytest.main([str(cases_dir), "-p", PLUGIN, "-p", "no:cacheprovider", "-p", "no:randomly", "-c", os.devnull,
                        "--rootdir", str(tmp_path), "-q", "--kvmatrix-runs-dir", str(tmp_path / RUNS_DIR),
                        "--kvmatrix-cache-dir", str(tmp_path / "cache"), *args], plugins=[Outcomes()])
    return int(code), outcomes


def test_pytest_and_kvmatrix_run_give_the_same_verdicts(matrix_with_waiver, tmp_path, monkeypatch):
    cases_dir = matrix_with_waiver
    monkeypatch.setattr(run_plan, "open_session", fake_sessions(run_plan.open_session, cases_dir, tmp_path))
    code = cli.main(["run", "--cases-dir", str(cases_dir), "--runs-dir", str(tmp_path / RUNS_DIR), "--run-id", "cli",
                     "--cache-dir", str(tmp_path / "cache"), "--db", str(tmp_path / "none.sqlite"), "--gpu", CPU_CLASS])
    assert code == 1  # crash[kv=fp8] fails: no rule and no waiver explains it
    by_cli = {r["cell_id"]: r["verdict"] for r in RunDir(tmp_path / RUNS_DIR / "cli").records()}
    assert by_cli == {"ok[kv=auto,skip=-,spec=-]": "pass", "ok[kv=fp8,skip=-,spec=-]": "skip",
                      "crash[kv=auto,skip=-,spec=-]": "xfail", "crash[kv=bfloat16,skip=-,spec=-]": "xfail",
                      "crash[kv=fp8,skip=-,spec=-]": "fail"}

    code, by_pytest = run_pytest_front_end(cases_dir, tmp_path, monkeypatch, "--kvmatrix-run-id", "pytest")
    assert code == pytest.ExitCode.TESTS_FAILED
    assert by_pytest == {cell: OUTCOME[verdict] for cell, verdict in by_cli.items()}
    stored = {r["cell_id"]: r for r in RunDir(tmp_path / RUNS_DIR / "pytest").records()}
    assert {cell: r["verdict"] for cell, r in stored.items()} == by_cli
    assert stored["crash[kv=auto,skip=-,spec=-]"]["waived"]["link"] == KNOWN_LINK


def test_pytest_front_end_refuses_a_folder_of_other_cases(matrix_with_waiver, tmp_path, monkeypatch):
    cases_dir = matrix_with_waiver
    code, _ = run_pytest_front_end(cases_dir, tmp_path, monkeypatch, "--kvmatrix-run-id", "shared", "-k", "ok")
    assert code == pytest.ExitCode.OK
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS], "matrix": {"kv_cache_dtype": ["auto"]}})
    code, outcomes = run_pytest_front_end(cases_dir, tmp_path, monkeypatch, "--kvmatrix-run-id", "shared", "-k", "ok")
    assert code == pytest.ExitCode.INTERRUPTED and not outcomes  # refused at collection, nothing ran
    code, _ = run_pytest_front_end(cases_dir, tmp_path, monkeypatch, "--kvmatrix-run-id", "shared", "-k", "ok",
                                   "--kvmatrix-force")
    assert code == pytest.ExitCode.OK


def test_an_interrupted_command_says_its_records_are_kept(monkeypatch, capsys):
    """Ctrl-C (or a CI step's SIGINT) ends `kvmatrix` with exit 130 and how to go on, not a traceback."""
    import argparse

    def interrupted(args):
        raise KeyboardInterrupt

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=interrupted)
    monkeypatch.setattr(cli, "build_parser", lambda argv: parser)
    assert cli.main([]) == 130
    assert "interrupted; every finished cell's record is kept" in capsys.readouterr().err


def test_pytest_front_end_resumes_a_run_with_the_cases_it_was_made_with(matrix_with_waiver, tmp_path, monkeypatch):
    cases_dir = matrix_with_waiver
    monkeypatch.chdir(tmp_path)  # the front end's run folders are under the working directory's reports/runs/
    monkeypatch.setattr(run_plan, "open_session", fake_sessions(run_plan.open_session, cases_dir, tmp_path))
    cli.main(["run", "--cases-dir", str(cases_dir), "--runs-dir", str(tmp_path / RUNS_DIR), "--run-id", "mine",
              "--cache-dir", str(tmp_path / "cache"), "--db", str(tmp_path / "none.sqlite"), "--gpu", CPU_CLASS,
              "--case", "ok"])
    code, outcomes = run_pytest_front_end(cases_dir, tmp_path, monkeypatch, "--kvmatrix-run-id", "mine", "-k", "ok",
                                          name_cases_dir=False)
    assert code == pytest.ExitCode.OK
    assert outcomes == {"ok[kv=auto,skip=-,spec=-]": "passed", "ok[kv=fp8,skip=-,spec=-]": "skipped"}


XDIST_CONFTEST = '''
from pathlib import Path

from tests.test_front_ends import fake_sessions
from kvmatrix.harness.run import plan as run_plan


def pytest_configure(config):
    run_plan.open_session = fake_sessions(run_plan.open_session, Path({cases!r}), Path({tmp!r}))
'''


def test_xdist_workers_write_one_run_folder_reported_once(matrix_with_waiver, tmp_path):
    """`-n 2`: the controller picks the run folder, each worker runs its share of the cells there (the machine's
    slots shared among them), and the reports cover every cell."""
    import subprocess

    from kvmatrix.harness.run.run_ids import runs_in

    root = tmp_path / "project"
    root.mkdir()
    (root / "conftest.py").write_text(XDIST_CONFTEST.format(cases=str(matrix_with_waiver), tmp=str(root)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", PLUGIN, "-p", "no:randomly",
                           "-p", "no:cacheprovider", "--rootdir", str(root), "-c", os.devnull, "--confcutdir",
                           str(root), "--kvmatrix-cases", str(matrix_with_waiver),
                           "--kvmatrix-runs-dir", str(root / RUNS_DIR), "--kvmatrix-cache-dir", str(root / "cache"),
                           "-q", str(root), str(matrix_with_waiver)],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert "1 failed, 1 passed, 1 skipped, 2 xfailed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = runs_in(root / RUNS_DIR)
    assert len(RunDir(run).records()) == 5
    assert "5 cells: 1 fail, 2 xfail, 1 pass, 1 skip" in (run / "matrix.md").read_text()


def test_a_broken_case_file_is_a_collection_error_naming_it_and_runs_nothing(matrix_with_waiver, tmp_path,
                                                                             monkeypatch, capsys):
    write_case(matrix_with_waiver, "typo", {"model": "lama"})
    code, outcomes = run_pytest_front_end(matrix_with_waiver, tmp_path, monkeypatch)
    assert code == pytest.ExitCode.INTERRUPTED and not outcomes  # pytest stops at collection errors
    out = capsys.readouterr().out
    assert "field 'model': 'lama' is not in the model registry (did you mean 'llama'?)" in out
    assert not (tmp_path / RUNS_DIR).exists() or not any(RunDir(r).records() for r in (tmp_path / RUNS_DIR).iterdir())
