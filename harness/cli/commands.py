"""Every `kvmatrix` command: its module and one line of help, so that `kvmatrix --help` lists them and a command
imports only its own module (pip's layout). A command module has `add_arguments(parser)`, which sets the
parser's `func` to what runs the command and returns its exit status (harness/cli/exit_codes.py)."""

from __future__ import annotations

from typing import NamedTuple


class CommandInfo(NamedTuple):
    module: str
    summary: str


COMMANDS: dict[str, CommandInfo] = {
    "run": CommandInfo("kvmatrix.harness.cli.run",
                       "run the matrix on this machine's class (its GPU, or its CPU's instruction set)"),
    "list": CommandInfo("kvmatrix.harness.cli.list", "list the cells the cases expand to"),
    "rejudge": CommandInfo("kvmatrix.harness.cli.rejudge",
                           "judge stored records again under the current cases (no vLLM runs)"),
    "report": CommandInfo("kvmatrix.harness.cli.report", "render the reports of one or more run folders"),
    "findings": CommandInfo("kvmatrix.harness.cli.findings",
                            "write a findings page for every unexplained failure of run folders"),
    "check": CommandInfo("kvmatrix.harness.cli.check",
                         "lint case files: what does not load, and rules that match no cell (nothing runs)"),
    "models": CommandInfo("kvmatrix.harness.cli.models", "list the model registry cases may name"),
    "init": CommandInfo("kvmatrix.harness.cli.init",
                        "write a starter folder of one's own cases (one case file, a README)"),
    "history": CommandInfo("kvmatrix.harness.cli.history", "the results history (SQLite)"),
    "diff": CommandInfo("kvmatrix.harness.cli.diff",
                        "what changed since each GPU class's previous run, or since a named run"),
    "pipeline": CommandInfo("kvmatrix.harness.cli.pipeline",
                            "write the Buildkite and GitHub Actions files from the pool and cases"),
    "bisect": CommandInfo("kvmatrix.harness.cli.bisect",
                          "find the vLLM release or commit that changed a cell's verdict"),
    "pr": CommandInfo("kvmatrix.harness.cli.pr",
                      "run the cells a vLLM change touches at its base and head, and diff them"),
    "surface": CommandInfo("kvmatrix.harness.cli.surface",
                           "what the installed vLLM declares each attention backend supports, per class"),
    "audit": CommandInfo("kvmatrix.harness.cli.audit",
                         "list every FAIL / ERROR of run folders that no case or waiver explains"),
    "repro": CommandInfo("kvmatrix.harness.cli.repro",
                         "write a standalone Python script (vLLM and torch only) reproducing a cell"),
    "qualify": CommandInfo("kvmatrix.harness.cli.qualify",
                           "a new vLLM release against the last: the matrix on both, changes bisected, findings "
                           "re-checked, waivers to remove or bound"),
    "recheck": CommandInfo("kvmatrix.harness.cli.recheck",
                           "run every finding's standalone script on a vLLM and write the findings status board"),
}
