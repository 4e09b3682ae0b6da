"""`kvmatrix --help` and `kvmatrix --version` load the command table, not the harness: a command's code (and the
errors it may raise) is imported only when that command runs. Each count is of a fresh interpreter's modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The command line itself: the table of commands, the exit statuses, `--version` and where kvmatrix is.
CLI_ONLY = {"kvmatrix", "kvmatrix.harness", "kvmatrix.harness.cli", "kvmatrix.harness.cli.commands",
            "kvmatrix.harness.cli.exit_codes", "kvmatrix.harness.cli.version", "kvmatrix.harness.record",
            "kvmatrix.harness.record.paths"}


def _loaded_by(argv: list[str]) -> set[str]:
    """The kvmatrix modules a fresh Python has loaded after `kvmatrix ARGV` (which exits, as --help does)."""
    code = ("import json, sys\nfrom kvmatrix.harness.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kvmatrix'))), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


def test_help_loads_only_the_command_line():
    assert _loaded_by(["--help"]) == CLI_ONLY


def test_a_commands_help_loads_that_command_and_not_the_others():
    assert _loaded_by(["init", "--help"]) == CLI_ONLY | {"kvmatrix.harness.cli.init"}
    loaded = _loaded_by(["models", "--help"])
    assert "kvmatrix.harness.cli.models" in loaded
    assert not loaded & {"kvmatrix.harness.cli.run", "kvmatrix.harness.run.plan", "kvmatrix.harness.bisect",
                         "kvmatrix.reports"}


def test_version_loads_the_command_line_and_the_vllm_versions_only():
    """The installed vLLM's version is vllm_compat's to read; nothing that runs, judges or reports is loaded."""
    extra = _loaded_by(["--version"]) - CLI_ONLY
    # vllm_compat's other tables load only when read (its __init__.pyi lists them): 23 modules more before.
    assert extra == {"kvmatrix.harness.vllm_compat", "kvmatrix.harness.vllm_compat.versions",
                     "kvmatrix.matrix", "kvmatrix.matrix.conditions"}


@pytest.mark.parametrize("error", ["CaseError", "SelectionError", "PoolError", "GuardError", "WaiverError",
                                   "RecordError", "EnvironmentBroken", "PipelineError"])
def test_a_commands_usage_error_is_still_one_line_and_exit_2(error, capsys, monkeypatch):
    """The errors said in one line are imported only once a command raised one: each still ends the command so."""
    from kvmatrix.harness import cli

    base = next(e for e in cli.usage_errors() if e.__name__ == error)
    # Each error class takes its own arguments; one made with a plain message stands for any of its raises.
    planted = type(error, (base,), {"__init__": Exception.__init__, "__str__": Exception.__str__})

    def fails(args: object) -> int:
        raise planted(f"the {error} said")

    monkeypatch.setattr(cli, "_run", fails)  # the command as it runs, whatever it is
    assert cli.main(["models"]) == 2
    assert capsys.readouterr().err.strip() == f"kvmatrix: the {error} said"
