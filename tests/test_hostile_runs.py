"""Faults and bad input through the `kvmatrix` commands, over fake cells (tests/fake_cell.py: the real cell
protocol, the production runner, judge, records and reports): a record that cannot be read is an ERROR in every
command that reads runs (counted, shown, in junit.xml, exit 1), never absent; a write error costs one cell, not the
run; every bad input is one line and exit 2; one run writes a run folder at a time; SIGTERM ends a run with a
message and leaves nothing in the temporary folder. Each test here failed before its fix."""

from __future__ import annotations

import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvmatrix.harness import cli
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.run.guards import RUN_META, lock_run_folder
from tests.conftest import CPU_CLASS, write_case
from tests.test_run_inputs import run_fake

REPO = Path(__file__).resolve().parent.parent
FAKE_CLI_RUN = [sys.executable, str(REPO / "tests" / "fake_cli_run.py")]
CRASH = "2-crash[kv=auto,skip=-,spec=-]"  # after the canary, a pass (tests/fake_cell.py: "2-" sorts it)


def one_fail_two_passes(cases_dir: Path, tmp_path: Path, monkeypatch) -> Path:
    """A run of one FAIL (an unexpected crash) and two passes, in its own folder."""
    write_case(cases_dir, "2-crash", {"model": "llama", "gpus": [CPU_CLASS]})
    write_case(cases_dir, "1-ok", {"model": "llama", "gpus": [CPU_CLASS], "matrix": {"kv_cache_dtype": ["auto",
                                                                                                      "bfloat16"]}})
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 1
    return tmp_path / "runs" / "r"


TORN = {
    "torn": lambda text: text[: len(text) // 2],
    "empty": lambda text: "",
    # a cell's own result file left where records are (an earlier phase: no verdict)
    "wrong phase": lambda text: json.dumps({k: v for k, v in json.loads(text).items()
                                            if k in ("cell_id", "gpu_class", "status", "phase", "layers")}),
}


@pytest.mark.parametrize("damage", TORN)
def test_an_unreadable_record_is_an_error_in_every_command_that_reads_runs(cases_dir, tmp_path, monkeypatch, capsys,
                                                                          damage):
    """Before: a torn or empty record vanished from report, rejudge, history import and diff: a run with one FAIL
    became "3 cells: 3 pass", exit 0, and junit.xml showed no failure."""
    run = one_fail_two_passes(cases_dir, tmp_path, monkeypatch)
    record = run / f"{CPU_CLASS}--{CRASH}.json"
    record.write_text(TORN[damage](record.read_text()))
    torn = record.read_bytes()
    capsys.readouterr()
    db = tmp_path / "history.sqlite"
    commands = {
        "report": ["report", str(run)],
        "rejudge": ["rejudge", str(run)],
        "history import": ["history", "import", str(run), "--db", str(db)],
        "diff": ["diff", str(run), "--db", str(tmp_path / "diff.sqlite")],
        "audit": ["audit", str(run), "--cases-dir", str(cases_dir)],
        "findings": ["findings", str(run), "--out", str(tmp_path / "pages")],
    }
    for name, argv in commands.items():
        assert cli.main(argv) == 1, name
        said = capsys.readouterr()
        assert CRASH in said.out + said.err and f"{record.name} cannot be read" in said.out + said.err, name
        if name in ("report", "rejudge"):
            junit = (run / "junit.xml").read_text()
            assert CRASH in junit and "cannot be read" in junit and 'errors="1"' in junit.replace("'", '"'), name
            assert "3 cells" in (run / "matrix.md").read_text() or CRASH in (run / "matrix.md").read_text()
        assert record.read_bytes() == torn, f"{name} wrote over the unreadable record"
    (verdict,) = sqlite3.connect(db).execute("SELECT verdict FROM results WHERE cell_id = ?", (CRASH,)).fetchone()
    assert verdict == "error"
    # A resume runs the cell again; its new record replaces the unreadable file.
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 1
    assert RunDir(run).read(CRASH, CPU_CLASS)["verdict"] == "fail"


def test_a_write_error_is_that_cells_error_and_the_run_goes_on(cases_dir, tmp_path, monkeypatch, capsys):
    """Before: an OSError writing one record (a full disk, a name too long) ended the whole run: the cell in
    flight lost, no report, and every resume crashed the same way."""
    write_case(cases_dir, "full", {"model": "llama", "gpus": [CPU_CLASS]})
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    write = RunDir.write

    def full_disk(self, record):
        if record.get("case") == "full":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.record_path(record["cell_id"], "x")))
        return write(self, record)

    monkeypatch.setattr(RunDir, "write", full_disk)
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 1
    run = tmp_path / "runs" / "r"
    report = (run / "matrix.md").read_text()
    assert "full[kv=auto,skip=-,spec=-]" in report and "No space left on device" in report
    assert "No space left on device" in (run / "junit.xml").read_text()
    assert RunDir(run).read("ok[kv=auto,skip=-,spec=-]", CPU_CLASS)["verdict"] == "pass"
    assert RunDir(run).read("full[kv=auto,skip=-,spec=-]", CPU_CLASS) is None  # not recorded: a resume runs it
    monkeypatch.setattr(RunDir, "write", write)  # the disk has room again
    capsys.readouterr()
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 0
    assert "(resumed)" in capsys.readouterr().out
    assert RunDir(run).read("full[kv=auto,skip=-,spec=-]", CPU_CLASS)["verdict"] == "pass"


def test_a_case_file_name_of_230_characters_runs_and_resumes(cases_dir, tmp_path, monkeypatch):
    """Before: its cells' file names passed 255 bytes; OSError (File name too long) stopped the run, and every
    resume. (206 characters already did, depending on the class's name and the runner's pid.)"""
    name = "a" * 230
    write_case(cases_dir, name, {"model": "llama", "gpus": [CPU_CLASS]})
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 0
    run = RunDir(tmp_path / "runs" / "r")
    assert run.read(f"{name}[kv=auto,skip=-,spec=-]", CPU_CLASS)["verdict"] == "pass"
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 0


def test_a_run_folder_in_use_is_refused(cases_dir, tmp_path, monkeypatch, capsys):
    """Before: two runs with the same run id ran every cell twice, side by side."""
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    with lock_run_folder(tmp_path / "runs" / "r"):  # another run holds it
        assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 2
        assert f"is in use by another kvmatrix run (pid {os.getpid()})" in capsys.readouterr().err
        assert RunDir(tmp_path / "runs" / "r").records() == []
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 0


def test_a_corrupt_run_json_stops_a_resume_with_a_message(cases_dir, tmp_path, monkeypatch, capsys):
    """Before: a resume took a run.json it could not read for none and went on with the built-in cases, mixing
    them into the user's run folder."""
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 0
    run = tmp_path / "runs" / "r"
    (run / RUN_META).write_text('{"cases_fingerprint": "ab')
    capsys.readouterr()
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--run-id", "r", "-k", "llama-skip") == 2
    assert "run.json cannot be read" in capsys.readouterr().err
    assert cli.main(["rejudge", str(run)]) == 2
    assert [r["case"] for r in RunDir(run).records()] == ["ok"]
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r", "--force") == 0


def test_a_corrupt_history_is_set_aside_and_stops_nothing(cases_dir, tmp_path, monkeypatch, capsys):
    """Before: a history that is not SQLite broke every command that opened it, `kvmatrix run` included, and
    `kvmatrix diff` exited 1, the status of new failures."""
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    db = tmp_path / "history.sqlite"
    db.write_bytes(b"not a database " * 100)
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r",
                    "--db", str(db)) == 0
    assert "set aside as history.sqlite.corrupt-" in capsys.readouterr().err
    (aside,) = tmp_path.glob("history.sqlite.corrupt-*")
    assert aside.read_bytes() == b"not a database " * 100  # kept, for whoever wants to look
    db.write_bytes(b"not a database " * 100)
    assert cli.main(["diff", "--db", str(db)]) == 2  # no run in it: a usage error, not "new failures"
    assert "set aside" in capsys.readouterr().err
    with sqlite3.connect(db) as other:  # SQLite, but not a history
        other.execute("DROP TABLE results")
        other.execute("CREATE TABLE results (x)")
    assert cli.main(["history", "runs", "--db", str(db)]) == 0
    assert "lacks" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [("--min-free-gb", "nan"), ("--min-free-gb", "-1"), ("--timeout-scale", "nan"),
                                  ("--timeout-scale", "0"), ("--timeout-scale", "inf")])
def test_run_flags_that_would_turn_a_check_off_are_refused(cases_dir, tmp_path, monkeypatch, capsys, flag):
    """Before: `--min-free-gb nan` or a negative value disabled the disk check; a NaN timeout scale never
    timed a cell out, 0 failed the canary as a broken environment."""
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    with pytest.raises(SystemExit) as caught:
        run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), *flag)
    assert caught.value.code == 2 and flag[0] in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_case_that_names_remote_code_is_set_aside_and_the_others_run(cases_dir, tmp_path, monkeypatch, capsys):
    """Before: `engine_args: {model: ..., trust_remote_code: true}` replaced the registry's model and ran its
    remote code, and the cell passed."""
    write_case(cases_dir, "evil", {"model": "llama", "gpus": [CPU_CLASS],
                                   "engine_args": {"model": str(tmp_path), "trust_remote_code": True}})
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 1
    said = capsys.readouterr()
    assert "case 'evil': field 'engine_args.model'" in said.err and "environment broken" not in said.err
    run = tmp_path / "runs" / "r"
    assert "evil[invalid]" in (run / "matrix.md").read_text()
    assert [r["case"] for r in RunDir(run).records()] == ["ok"]


@pytest.mark.parametrize("name", [b"caf\xe9", b"two\nlines"], ids=["not-utf8", "newline"])
def test_a_case_file_whose_name_is_no_case_name_is_set_aside_and_the_others_run(cases_dir, tmp_path, monkeypatch,
                                                                                capsys, name):
    """Before: a file name that is not UTF-8 stopped the run with a traceback; a line break in one split the
    report's rows."""
    with open(os.path.join(os.fsencode(cases_dir), name + b".yaml"), "w") as f:
        f.write("model: llama\n")
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 1
    err = capsys.readouterr().err
    assert "a case name is printable UTF-8 text" in err and "Traceback" not in err
    run = tmp_path / "runs" / "r"
    rows = [line for line in (run / "matrix.md").read_text().splitlines() if line.startswith("| ")]
    assert all(line.endswith("|") for line in rows) and any("[invalid]" in line for line in rows)
    assert [r["case"] for r in RunDir(run).records()] == ["ok"]


def test_a_registry_model_that_cannot_be_had_is_its_cells_error_not_a_broken_environment(
        cases_dir, tmp_path, monkeypatch, capsys):
    """Before: the first model's plain cell is the canary, so a model of the user's own registry that has no build
    stopped the run as "environment broken", recording nothing."""
    (cases_dir / "_models.yaml").write_text((cases_dir / "_models.yaml").read_text()
                                            + "mine:\n  tiny: no_such_builder\n")
    write_case(cases_dir, "a-mine", {"model": "mine", "gpus": [CPU_CLASS]})
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU_CLASS]})
    assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", "r") == 1
    assert "environment broken" not in capsys.readouterr().err
    records = {r["case"]: r for r in RunDir(tmp_path / "runs" / "r").records()}
    assert records["ok"]["verdict"] == "pass"
    assert records["a-mine"]["verdict"] == "error" and "'mine' has no local build" in records["a-mine"]["reason"]


def slow_run(cases_dir: Path, tmp_path: Path, tmpdir: Path, sleep: str = "2", run_id: str = "r"
             ) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a fake `kvmatrix run` of four slow cells forked from a (fake) template, with
    its own temporary folder."""
    write_case(cases_dir, "slow", {"model": "llama", "gpus": [CPU_CLASS], "timeout_s": 30,
                                   "matrix": {"kv_cache_dtype": ["auto", "bfloat16", "fp8", "fp8_e5m2"]}})
    return ([*FAKE_CLI_RUN, str(cases_dir), str(tmp_path), "--run-id", run_id, "--jobs", "1", "--isolation",
             "process"],
            {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmpdir), "FAKE_CELL_SLEEP": sleep,
             "FAKE_TEMPLATES": "1"})


def started(command: tuple[list[str], dict[str, str]]) -> subprocess.Popen:
    return subprocess.Popen(command[0], env=command[1], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def wait_for_records(run: Path, count: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while len(list(run.glob(f"{CPU_CLASS}--*.json"))) < count:
        assert time.monotonic() < deadline and proc.poll() is None, "the run ended early"
        time.sleep(0.1)


def test_sigterm_ends_a_run_with_a_message_and_no_socket_folder_outlives_a_run(cases_dir, tmp_path):
    """Before: SIGTERM ended the run silently and, like SIGKILL, left the template's socket folder behind in the
    temporary folder; nothing ever removed them."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    run = tmp_path / "runs" / "r"
    proc = started(slow_run(cases_dir, tmp_path, tmpdir))
    wait_for_records(run, 1, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "kvmatrix: terminated (SIGTERM); every finished cell's record is kept" in err
    assert list(tmpdir.glob("kvmatrix-template-*")) == []

    # A run of its own (all four cells to go, whatever the first kept): killed once its template is up.
    proc = started(slow_run(cases_dir, tmp_path, tmpdir, run_id="k"))
    deadline = time.monotonic() + 120
    while not list(tmpdir.glob("kvmatrix-template-*")):
        assert time.monotonic() < deadline and proc.poll() is None, "no template folder while the run went on"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)  # nothing can clean up after this one
    proc.communicate(timeout=60)
    assert list(tmpdir.glob("kvmatrix-template-*")) != []
    command, env = slow_run(cases_dir, tmp_path, tmpdir, sleep="0", run_id="k")
    del env["FAKE_TEMPLATES"]  # a run that forks nothing (a GPU class, --no-template) removes them too
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert list(tmpdir.glob("kvmatrix-template-*")) == []  # the killed run's folder removed by the next run
    assert len(RunDir(tmp_path / "runs" / "k").records()) == 4
