"""`kvmatrix`: the command line over matrix/ (cases → cells), harness/ (cells → records) and reports/.

A table of commands (commands.py), one module each, imported only when that command runs (pip's layout); exit
statuses in exit_codes.py; which cells a command works on in selection.py; what a run prints and writes in
output.py."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import TextIO

from kvmatrix.harness.cli.commands import COMMANDS
from kvmatrix.harness.cli.exit_codes import BROKEN_PIPE, INTERRUPTED, TERMINATED, USAGE
from kvmatrix.harness.cli.version import VersionAction

# What `kvmatrix --help` tells a user; the docstring above is for whoever reads this module.
DESCRIPTION = ("Runs vLLM over a matrix of KV-cache configurations (case files: models x --kv-cache-dtype x skip "
               "layers x speculative decoding x backend x execution mode), judges each cell against its "
               "expectations and renders the matrix. Start with `kvmatrix init DIR`, then `kvmatrix list "
               "--cases-dir DIR` and `kvmatrix run --cases-dir DIR`; without --cases-dir the built-in cases run.")



def usage_errors() -> tuple[type[Exception], ...]:
    """What a command raises when it cannot do what was asked: said in one line, exit USAGE. Imported only once a
    command raised (or a front end asks): their modules are the harness's, which `kvmatrix --help` does not load."""
    from kvmatrix.harness.judge.waivers import WaiverError
    from kvmatrix.harness.pipelines import PipelineError
    from kvmatrix.harness.record.types import RecordError
    from kvmatrix.harness.run.cases import SelectionError
    from kvmatrix.harness.run.guards import GuardError
    from kvmatrix.harness.run.order.canary import EnvironmentBroken
    from kvmatrix.matrix.machine import PoolError
    from kvmatrix.matrix.schema import CaseError

    return (CaseError, SelectionError, PoolError, GuardError, WaiverError, RecordError, EnvironmentBroken,
            PipelineError)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Every command listed with its summary; only the one `argv` names gets its arguments (its module imported)."""
    parser = argparse.ArgumentParser(prog="kvmatrix", description=DESCRIPTION)
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, info in COMMANDS.items():
        command = sub.add_parser(name, help=info.summary, description=info.summary)
        if name == chosen:
            importlib.import_module(info.module).add_arguments(command)
            command.add_argument("--trust-case-code", action="store_true",
                                 help="the case folder is your own, trusted like code: its model registry and pool "
                                      "may name remote code, tokenizers, paths and classes, as the built-in ones "
                                      "do (without it a folder's files are a stranger's data: docs/case-files.md)")
    return parser


@contextlib.contextmanager
def case_code_trust(trusted: bool) -> Iterator[None]:
    """--trust-case-code for this command and the processes it starts (cells, pytest workers, bisection steps
    read the same variable), undone when it ends."""
    from kvmatrix.matrix.trust import TRUST_CASE_CODE_ENV  # the matrix's, read when a command runs

    before = os.environ.get(TRUST_CASE_CODE_ENV)
    if trusted:
        os.environ[TRUST_CASE_CODE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRUST_CASE_CODE_ENV, None)
        else:
            os.environ[TRUST_CASE_CODE_ENV] = before


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI runner's cancel, `kill`): unwinds as Ctrl-C does, so running cells and templates are ended and
    the temporary folders removed."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def _interrupted(signum: int, frame: object) -> None:
    """The first Ctrl-C unwinds (running cells are killed, a partial report written); a second one, while that
    goes on, ends the process at once: its cell processes and templates die with it (their parent-death signal)."""
    signal.signal(signal.SIGINT, _interrupted_again)
    raise KeyboardInterrupt


def _interrupted_again(signum: int, frame: object) -> None:
    os.write(2, b"kvmatrix: interrupted again: stopping now, without the reports\n")
    os._exit(INTERRUPTED)


_python_show_warning = warnings.showwarning


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    """A case file's old spelling said as the command's own line (Python's own format adds a line of our source)."""
    from kvmatrix.matrix.spelling import OldSpelling  # raised only by a command, which loaded it already

    if issubclass(category, OldSpelling):
        print(f"kvmatrix: warning: {message}", file=file or sys.stderr)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


def _run(args: argparse.Namespace) -> int:
    with warnings.catch_warnings(), case_code_trust(getattr(args, "trust_case_code", False)):
        warnings.showwarning = _show_warning  # catch_warnings restores Python's own display after the command
        return args.func(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()  # only there may a handler be set
    on_term = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    # Where SIGINT is Python's (not ignored: a job started in the background keeps it ignored), a second one stops.
    on_int = signal.getsignal(signal.SIGINT) if main_thread else None
    if on_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)
    try:
        try:
            return _run(args)
        except Exception as err:
            if isinstance(err, usage_errors()):
                print(f"kvmatrix: {err}", file=sys.stderr)
                return USAGE
            raise
    except BrokenPipeError:
        # The reader stopped reading (`| head`): nothing is wrong and nobody is listening. Python would still flush
        # stdout into the closed pipe at exit and complain, so stdout goes to /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE
    except OSError as err:  # a file the command writes or reads (a full disk, no permission): said, not a traceback
        print(f"kvmatrix: {err.filename or ''}{': ' if err.filename else ''}{err.strerror or err}", file=sys.stderr)
        return USAGE
    except Terminated:
        print("kvmatrix: terminated (SIGTERM); every finished cell's record is kept, and the same command (same "
              "--run-id) goes on from there", file=sys.stderr)
        return TERMINATED
    except KeyboardInterrupt:  # Ctrl-C, or SIGINT from a CI step's time limit: running cells were killed
        print("kvmatrix: interrupted; every finished cell's record is kept: `kvmatrix run --resume` (the latest run, "
              "or --resume RUN_ID) goes on from there", file=sys.stderr)
        return INTERRUPTED
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, on_term)
            if on_int is signal.default_int_handler:
                signal.signal(signal.SIGINT, on_int)
