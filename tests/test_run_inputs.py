"""A run remembers its inputs: the run folder records the cases folder it was made with, and the commands that
read a run later (findings, repro, rejudge, a resumed run) use it without being told; the reproduce line of a
findings page works as printed. A selection names cells exactly (`-k` with a whole id is that cell) and one that
matches nothing is an error naming it, not an empty report."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from kvmatrix.harness import cli
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run import plan as run_plan
from kvmatrix.harness.run.guards import RUN_META, claim_run_folder, recorded_cases_dir
from kvmatrix.matrix.load import CASES_DIR
from tests.conftest import CPU_CLASS, write_case
from tests.test_front_ends import fake_sessions

CRASH = "crash[kv=fp8,skip=-,spec=-]"


def run_fake(cases_dir: Path, tmp_path: Path, monkeypatch, *args: str) -> int:
    monkeypatch.setattr(run_plan, "open_session", fake_sessions(run_plan.open_session, cases_dir, tmp_path))
    return cli.main(["run", "--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache"),
                     "--db", str(tmp_path / "none.sqlite"), "--gpu", CPU_CLASS, *args])


def test_the_run_folder_records_its_cases_folder(cases_dir, tmp_path):
    claim_run_folder(tmp_path / "mine", cases_dir)
    claim_run_folder(tmp_path / "default", CASES_DIR)
    assert json.loads((tmp_path / "mine" / RUN_META).read_text())["cases_dir"] == str(cases_dir.resolve())
    assert json.loads((tmp_path / "default" / RUN_META).read_text())["cases_dir"] is None  # portable
    assert recorded_cases_dir(tmp_path / "mine") == cases_dir.resolve()
    assert recorded_cases_dir(tmp_path / "default") == CASES_DIR
    assert recorded_cases_dir(tmp_path / "from-before-it-was-recorded") == CASES_DIR


def test_findings_and_rejudge_use_the_runs_cases_and_the_reproducer_works_as_printed(
        matrix_with_waiver, tmp_path, monkeypatch, capsys):
    cases_dir = matrix_with_waiver
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 1
    run = tmp_path / "runs" / "r"
    (page,) = (run / "findings").glob("*--crash*.md")
    line = next(x for x in page.read_text().splitlines() if x.startswith("kvmatrix run "))
    assert line == f"kvmatrix run --cases-dir {cases_dir.resolve()} --gpu {CPU_CLASS} --cell '{CRASH}'"
    assert run_fake(cases_dir, tmp_path, monkeypatch, *shlex.split(line)[2:], "--run-id", "again") == 1
    assert [r["cell_id"] for r in RunDir(tmp_path / "runs" / "again").records()] == [CRASH]  # as printed

    assert cli.main(["findings", str(run), "--out", str(tmp_path / "pages")]) == 0
    (again,) = (tmp_path / "pages").glob("*--crash*.md")
    assert f"--cases-dir {cases_dir.resolve()}" in again.read_text()

    # A waiver added to the run's cases: rejudging without --cases-dir applies it.
    (cases_dir / "_waivers.txt").write_text(f"crash[kv=auto,*] https://example.org/known\n{CRASH} https://x.org/y\n")
    assert cli.main(["rejudge", str(run)]) == 0
    assert RunDir(run).read(CRASH, CPU_CLASS)["verdict"] == "xfail"


def test_repro_takes_the_runs_cases(matrix_with_waiver, tmp_path, monkeypatch):
    cases_dir = matrix_with_waiver
    run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r", "--case", "crash")
    out = tmp_path / "repro.py"
    assert cli.main(["repro", CRASH, "--run", str(tmp_path / "runs" / "r"), "--full", "--out", str(out),
                     "--cache-dir", str(tmp_path / "cache")]) == 0
    assert f"kvmatrix repro '{CRASH}' --cases-dir {cases_dir.resolve()} --gpu {CPU_CLASS}" in out.read_text()


def test_a_whole_cell_id_selects_only_that_cell(cases_dir, capsys):
    for name in ("a", "ba"):  # ba[kv=auto,...] contains a[kv=auto,...]
        write_case(cases_dir, name, {"model": "llama", "gpus": [CPU_CLASS], "matrix": {"kv_cache_dtype": ["auto"]}})
    assert cli.main(["list", "--cases-dir", str(cases_dir), "-k", "a[kv=auto,skip=-,spec=-]"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"a[kv=auto,skip=-,spec=-]  [{CPU_CLASS}]"]
    assert cli.main(["list", "--cases-dir", str(cases_dir), "-k", "*a[kv=auto*"]) == 0  # wildcards still glob
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert cli.main(["list", "--cases-dir", str(cases_dir), "-k", "[kv=auto"]) == 0  # a fragment: a substring
    assert len(capsys.readouterr().out.splitlines()) == 2


@pytest.mark.parametrize("selection, named", [(["-k", "nothing-like-this"], "-k nothing-like-this"),
                                              (["--case", "nope"], "--case nope"),
                                              (["--cell", "a[kv=fp8]"], "--cell 'a[kv=fp8]'")])
def test_a_selection_of_no_cell_is_an_error_naming_it(cases_dir, tmp_path, capsys, selection, named):
    write_case(cases_dir, "a", {"model": "llama", "gpus": [CPU_CLASS], "matrix": {"kv_cache_dtype": ["auto"]}})
    for command in (["list"], ["run", "--runs-dir", str(tmp_path / "runs"), "--gpu", CPU_CLASS]):
        assert cli.main([*command, "--cases-dir", str(cases_dir), *selection]) == 2
        assert f"no cell of {cases_dir} matches {named}" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # no empty report


def test_a_missing_cases_folder_is_named(tmp_path, capsys):
    assert cli.main(["list", "--cases-dir", str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'}: no such folder of case files" in capsys.readouterr().err
