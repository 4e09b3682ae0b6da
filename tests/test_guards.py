"""Refusals before a run starts: a results folder made with other case files, a nearly full disk, a GPU class
that is not this machine's (the CLI's exit status 2 with the reason, nothing written)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmatrix.harness.run.guards import GuardError, check_free_disk, claim_run_folder
from tests.conftest import CPU_CLASS, write_case

REPO = Path(__file__).resolve().parent.parent


def test_a_run_folder_belongs_to_one_case_set(cases_dir, tmp_path):
    write_case(cases_dir, "a", {"model": "llama"})
    run = tmp_path / "run"
    claim_run_folder(run, cases_dir)
    claim_run_folder(run, cases_dir)  # the same cases resume
    write_case(cases_dir, "a", {"model": "llama", "timeout_s": 5})
    with pytest.raises(GuardError, match="judged under other case files.*--force"):
        claim_run_folder(run, cases_dir)
    claim_run_folder(run, cases_dir, force=True)


def test_nearly_full_disk_is_refused(tmp_path):
    check_free_disk(tmp_path / "not" / "yet", 0.001)
    with pytest.raises(GuardError, match="GiB free under"):
        check_free_disk(tmp_path, 10**9)


def kvmatrix(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvmatrix.harness.cli", *args], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


def test_cli_refuses_with_a_reason_and_writes_nothing(tmp_path):
    runs = tmp_path / "runs"
    wrong_class = kvmatrix("run", "--gpu", "L4", "--runs-dir", str(runs))
    assert wrong_class.returncode == 2 and f"this machine is '{CPU_CLASS}', not 'L4'" in wrong_class.stderr
    full_disk = kvmatrix("run", "--runs-dir", str(runs), "--min-free-gb", "1e9")
    assert full_disk.returncode == 2 and "GiB free under" in full_disk.stderr
    assert not runs.exists()
