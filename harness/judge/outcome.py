"""What happened to a cell process, from its result file (possibly partial), exit status and log tail: `ok`,
`crash` (named by a signature, else by its fingerprint), `timeout`, `killed` or `error`. Also names a stored
failure again under the current signature table and fingerprint rules."""

from __future__ import annotations

import signal

from kvmatrix.harness.judge.fingerprint import UNFINGERPRINTED_STATUSES, signal_of, stamp
from kvmatrix.harness.judge.signatures import classify, last_exception_line
from kvmatrix.harness.record.types import CellOutput, ExceptionInfo, OutcomeRecord


def _failure_text(exception: ExceptionInfo, log_tail: str) -> str:
    return "\n".join(filter(None, [exception.get("message"), exception.get("traceback_tail"), log_tail]))


def classify_outcome(returncode: int, timed_out: bool, timeout: float, result: CellOutput, log_tail: str
                     ) -> OutcomeRecord:
    """What happened to the cell process, from its result file (possibly partial), exit status and log: the
    result with the outcome added (a new dict)."""
    outcome: OutcomeRecord = {**result}
    exception = result.get("exception") or {}
    text = _failure_text(exception, log_tail)
    if timed_out:
        outcome["status"] = "timeout"
        outcome["error_tail"] = f"no result within {timeout:g} s (phase {result.get('phase', 'start')})"
    elif returncode < 0:
        name = signal.Signals(-returncode).name
        # SIGKILL/SIGTERM come from outside (OOM killer, an operator); other signals are the cell's own crash.
        killed = -returncode in (signal.SIGKILL, signal.SIGTERM)
        outcome["status"] = "killed" if killed else "crash"
        outcome["signal"] = name
        # A kill has no message of its own: the log's last line (a warning of vLLM's start) would read as its
        # cause. Only an exception the cell raised before is quoted.
        said = last_exception_line(log_tail, last_line=not killed)
        outcome["error_tail"] = f"{name} in phase {result.get('phase', 'start')}" + (
            f": {said}" if said else ": killed from outside the cell (the OOM killer, an operator, a time limit)")
        outcome["signature"] = classify(text, result.get("vllm_version")) or f"signal_{name}"
    elif result.get("status") == "crash":
        message = exception.get("message") or ""
        outcome["error_tail"] = (f"{exception.get('type')}: {message}"[:500] if exception.get("type")
                                 else last_exception_line(log_tail))
        outcome["signature"] = classify(text, result.get("vllm_version"))
    elif result.get("status") == "ok" and result.get("phase") == "done":
        outcome["status"] = "ok"
    else:
        outcome["status"] = "error"
        outcome["error_tail"] = (f"cell process exited {returncode} without a complete result: "
                                 f"{last_exception_line(log_tail)}")
    stamp(outcome, log_tail)
    return outcome


def reclassified(record: OutcomeRecord, log_tail: str) -> OutcomeRecord:
    """A stored failure named and fingerprinted again with the current signature table and fingerprint rules, from
    its exception and its log's tail (`RunDir.log_tail`): a new record; records of earlier harnesses get their
    fingerprint here."""
    if record.get("status") in UNFINGERPRINTED_STATUSES:
        return record
    out: OutcomeRecord = {**record}
    if out.get("status") == "crash":
        text = _failure_text(out.get("exception") or {}, log_tail)
        died_of = signal_of(out)
        out["signature"] = classify(text, out.get("vllm_version")) or (f"signal_{died_of}" if died_of else None)
    stamp(out, log_tail)
    return out
