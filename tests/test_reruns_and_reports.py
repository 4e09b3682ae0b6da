"""A run starts afresh unless resumed explicitly (as pytest and lm-eval do): the same command twice makes two run
folders, and the second runs its cells (a findings page's reproducer, run after a fix, runs vLLM again);
`--resume [RUN_ID|latest]` and a named `--run-id` go on with an earlier run. `kvmatrix report` of several runs
writes a new folder whose links resolve, never into a run; `rejudge` rewrites a run's findings pages."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from urllib.parse import unquote

import pytest

from kvmatrix.harness import cli
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.run_ids import new_run_id, runs_in
from tests.conftest import CPU_CLASS, KNOWN_LINK, write_case
from tests.test_run_inputs import CRASH, run_fake

FRESH_ID = re.compile(rf"\d{{8}}-\d{{6}}-{re.escape(CPU_CLASS)}-vllm.+")


def finished_lines(out: str) -> list[str]:
    """A run's line per finished cell (not its line as each cell starts, nor a heartbeat: harness/run/activity.py)."""
    return [line for line in out.splitlines() if re.match(r"\[[^]]*\] (?!start |running )", line)]


def test_the_same_command_twice_runs_twice_into_new_folders(matrix_with_waiver, tmp_path, monkeypatch, capsys):
    cases_dir = matrix_with_waiver
    for _ in range(2):
        assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--case", "ok") == 0
    runs = runs_in(tmp_path / "runs")
    assert len(runs) == 2 and all(FRESH_ID.fullmatch(run.name) for run in runs)
    second = finished_lines(capsys.readouterr().out)[-2:]
    assert not any("(resumed)" in line for line in second), second  # the cells ran again


def test_resume_goes_on_with_the_latest_or_a_named_run(matrix_with_waiver, tmp_path, monkeypatch, capsys):
    cases_dir = matrix_with_waiver
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "first",
                    "--case", "ok") == 0
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--case", "ok") == 0
    capsys.readouterr()
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--resume", "first", "--case", "ok") == 0
    out = capsys.readouterr().out
    assert f"run {tmp_path / 'runs' / 'first'}" in out
    assert all("(resumed)" in line for line in finished_lines(out))
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--resume", "--case", "ok") == 0  # latest: `first` again
    assert all("(resumed)" in line for line in finished_lines(capsys.readouterr().out))
    assert len(runs_in(tmp_path / "runs")) == 2
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--resume", "nope") == 2
    assert "no run 'nope' under" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse: one or the other
        run_fake(cases_dir, tmp_path, monkeypatch, "--resume", "first", "--run-id", "first")
    assert refused.value.code == 2


def test_a_run_id_is_new_even_within_the_same_second(tmp_path):
    first = new_run_id("cpu-x", "1.0", tmp_path)
    (tmp_path / first).mkdir()
    assert new_run_id("cpu-x", "1.0", tmp_path) == f"{first}-2"


def test_the_findings_reproducer_runs_the_cell_again(matrix_with_waiver, tmp_path, monkeypatch, capsys):
    cases_dir = matrix_with_waiver
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--case", "crash") == 1
    (run,) = runs_in(tmp_path / "runs")
    (page,) = (run / "findings").glob("*--crash*.md")
    line = next(x for x in page.read_text().splitlines() if x.startswith("kvmatrix run "))
    capsys.readouterr()
    assert run_fake(cases_dir, tmp_path, monkeypatch, *shlex.split(line)[2:]) == 1
    (ran,) = finished_lines(capsys.readouterr().out)
    assert CRASH in ran and "(resumed)" not in ran
    assert len(runs_in(tmp_path / "runs")) == 2


def two_runs(cases_dir: Path, tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    for run_id in ("a", "b"):
        run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", run_id)
    return tmp_path / "runs" / "a", tmp_path / "runs" / "b"


def test_a_report_of_several_runs_goes_to_a_new_folder_whose_links_resolve(matrix_with_waiver, tmp_path,
                                                                          monkeypatch, capsys):
    a, b = two_runs(matrix_with_waiver, tmp_path, monkeypatch)
    own = {name: (a / name).read_bytes() for name in ("matrix.md", "matrix.html", "junit.xml")}
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", str(a), str(b)]) == 0
    assert {name: (a / name).read_bytes() for name in own} == own  # run a's own reports are untouched
    (out,) = (tmp_path / "reports").glob("report-*")
    html = (out / "matrix.html").read_text()
    logs = re.findall(r'"log":"([^"]+)"', html)
    findings = re.findall(r'"finding":"([^"]+)"', html)
    assert len(logs) == 8 and findings  # every cell that ran (the skipped one has no log), of both runs
    for link in logs:
        assert (out / link).is_file(), link
    assert len(set(findings)) == 2  # each run's failure its own page, not one run's page for both
    for link, run in zip(sorted(findings), (a, b), strict=True):
        text = (out / unquote(link)).read_text()
        assert f"--gpu {CPU_CLASS} --cell" in text and f"--run {run} " in text, text  # its class, its run
    assert cli.main(["report", str(a), str(b), "--out", str(a)]) == 2
    assert "is one of the runs reported" in capsys.readouterr().err


def test_rejudge_rewrites_the_findings_pages(matrix_with_waiver, tmp_path, monkeypatch):
    cases_dir = matrix_with_waiver
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 1
    run = tmp_path / "runs" / "r"
    assert list((run / "findings").glob("*--crash*.md"))
    write_case(cases_dir, "crash", {
        "model": "llama", "gpus": [CPU_CLASS], "matrix": {"kv_cache_dtype": ["auto", "bfloat16", "fp8"]},
        "expect": [{"when": {"kv_cache_dtype": ["bfloat16", "fp8"]},
                    "crash": {"signature": "no_common_block_size", "link": KNOWN_LINK}}]})
    assert cli.main(["rejudge", str(run)]) == 0
    assert RunDir(run).read(CRASH, CPU_CLASS)["verdict"] == "xfail"
    assert not list((run / "findings").glob("*.md"))  # nothing is unexplained any more
