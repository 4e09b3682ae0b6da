"""Crash fingerprints: one stable id per distinct failure, whether or not the signature table names it.

A hand-kept table of patterns always trails vLLM; the fingerprint is what groups the failures nobody has named
yet (diff, history, findings, reports). It hashes what stays the same when the same crash happens in another
cell, on another machine or in another vLLM release: the root exception's type, its message with numbers, paths,
addresses, sizes and memory amounts replaced by placeholders, and the innermost vLLM frame (module:function, no
line number). A timeout or a kill has no exception: its signal (or `timeout`) and phase tell it apart.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from kvmatrix.harness.record.parts import Crash as CrashPart
from kvmatrix.harness.record.types import ExceptionInfo, OutcomeRecord
from kvmatrix.harness.vllm_compat import ENGINE_DEATH_WRAPPER

ID_LENGTH = 8
MESSAGE_CAP = 300
UNFINGERPRINTED_STATUSES = ("ok", "skipped")

_WRAPPER = re.compile(ENGINE_DEATH_WRAPPER, re.I)
# At the start of a line or after a process's log prefix ("(EngineCore_DP0 pid=1) ERROR ... [core.py:9] ",
# torch's "[rank0]: ").
_LINE_START = r"(?:^|[\])]:? )\s*"
_CHAIN = re.compile(_LINE_START + r"(?:The above exception was the direct cause|During handling of the above exc)")
# "ValueError: msg", or a bare "AssertionError".
_EXCEPTION = re.compile(_LINE_START + r"((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Failed))(?:: (.*)|\s*$)")
# Tracebacks: `File "p", line 3, in f` (innermost last); faulthandler: `File "p", line 3 in f` (innermost first).
_FRAME = re.compile(r'File "([^"]+)", line \d+,? in (\S+)')
_FAULTHANDLER = re.compile(r"^Current thread 0x[0-9a-f]+ \(most recent call first\):\n((?:[ \t]+File .*\n?)+)",
                           re.M)
# Records written before the `signal` field existed start their error tail with it ("SIGSEGV in phase init: ...").
_SIGNAL_IN_TAIL = re.compile(r"^(SIG[A-Z0-9]+) in phase")
# Order matters: memory amounts and URLs hold slashes and numbers that the later rules would split.
_PLACEHOLDERS = (
    (re.compile(r"\b[a-z][a-z+]*://\S+"), "<url>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<addr>"),
    (re.compile(r"\b\d+(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?\s*(?:[KMGTP]i?B|bytes?)\b", re.I), "<mem>"),
    (re.compile(r"(?<![\w.])(?:~|\.{1,2})?(?:/[\w.@+-]+)+/?"), "<path>"),
    (re.compile(r"\btmp\w{6,}\b"), "<tmp>"),
    (re.compile(r"\b\d+(?:\s*x\s*\d+)+\b"), "<shape>"),
    (re.compile(r"\b\d+(?:\.\d+)*\b"), "<n>"),
    (re.compile(r"\s+"), " "),
)


@dataclass(frozen=True)
class Crash:
    """The readable parts a fingerprint hashes."""

    type: str  # the root exception's class name, `timeout`, or a signal's name
    message: str  # normalized; empty for timeouts, kills and signals
    site: str | None  # `vllm.<module>:<function>` of the innermost vLLM frame (else of the innermost frame)
    phase: str | None  # only where nothing else tells crashes apart: timeouts, kills, signals without a frame

    @property
    def id(self) -> str:
        parts = "\x1f".join(part or "" for part in (self.type, self.message, self.site, self.phase))
        return hashlib.sha256(parts.encode()).hexdigest()[:ID_LENGTH]

    def part(self) -> CrashPart:
        """The record's `crash`: these parts, in this order."""
        return CrashPart(type=self.type, message=self.message, site=self.site, phase=self.phase)


@dataclass
class _Raised:
    """One exception line of a traceback or log, with the frames printed above it."""

    type: str
    message: str
    frames: list[tuple[str, str]]
    chained: bool  # a chain marker separates it from the exception before it: that one is its cause


def normalize(message: str) -> str:
    """The message with what varies between cells and machines (numbers, paths, sizes...) as placeholders."""
    for pattern, placeholder in _PLACEHOLDERS:
        message = pattern.sub(placeholder, message)
    return message.strip()[:MESSAGE_CAP]


def fingerprint(record: OutcomeRecord, log_tail: str = "") -> Crash | None:
    """The crash of a record (its status, phase, exception, error tail, signal) and its cell's log tail; None for a
    record that ended ok or was skipped."""
    status, phase = record.get("status"), record.get("phase") or "start"
    if status in UNFINGERPRINTED_STATUSES:
        return None
    if status == "timeout":
        return Crash("timeout", "", None, phase)
    signal = signal_of(record)
    if status == "killed":
        return Crash(signal or "killed", "", None, phase)
    if signal:  # the cell's own crash by signal: only a faulthandler dump says where
        site = _site(_faulthandler_frames(log_tail))
        return Crash(signal, "", site, None if site else phase)
    raised = _root_exception(record.get("exception") or {}, log_tail)
    if raised is None:
        return Crash(status or "error", normalize(record.get("error_tail") or ""), None, phase)
    return Crash(raised.type.rsplit(".", 1)[-1], normalize(raised.message), _site(raised.frames), None)


def stamp(record: OutcomeRecord, log_tail: str = "") -> None:
    """Set a record's `fingerprint` (the id) and `crash` (its parts), or remove them where it did not fail."""
    crash = fingerprint(record, log_tail)
    record.pop("fingerprint", None)
    record.pop("crash", None)
    if crash is not None:
        record.update({"fingerprint": crash.id, "crash": crash.part()})


def failure_name(record: OutcomeRecord) -> str | None:
    """What reports call a failure: its signature's name, else `crash <fingerprint> (<exception type>)`."""
    if record.get("signature"):
        return record["signature"]
    if record.get("fingerprint"):
        return f"crash {record['fingerprint']} ({(record.get('crash') or {}).get('type', '?')})"
    return None


def signal_of(record: OutcomeRecord) -> str | None:
    """The signal that ended the cell process, if one did."""
    found = _SIGNAL_IN_TAIL.match(record.get("error_tail") or "")
    return record.get("signal") or (found.group(1) if found else None)


def _root_exception(exception: ExceptionInfo, log_tail: str) -> _Raised | None:
    """The innermost cause: in the exception's own chain, else (the exception wraps another process's death, or
    there is none) in the log."""
    if exception.get("type"):
        raised = _parse(exception.get("traceback_tail") or "")
        own = _Raised(exception["type"], exception.get("message") or "", [], False)
        if raised:  # the traceback's last line is the exception itself, its message maybe cut to one line
            own.frames, own.chained = raised[-1].frames, raised[-1].chained
            raised[-1] = own
        root = _innermost_cause(raised or [own])
        return root or _innermost_cause(_parse(log_tail)) or own
    return _innermost_cause(_parse(log_tail))


def _innermost_cause(raised: list[_Raised]) -> _Raised | None:
    """The last exception that is no wrapper, followed back along its chain to its first cause."""
    real = [i for i, r in enumerate(raised) if not _WRAPPER.search(r.message)]
    if not real:
        return None
    index = real[-1]
    while raised[index].chained and index > 0 and not _WRAPPER.search(raised[index - 1].message):
        index -= 1
    return raised[index]


def _parse(text: str) -> list[_Raised]:
    raised: list[_Raised] = []
    frames: list[tuple[str, str]] = []
    chained = False
    for line in text.splitlines():
        if frame := _FRAME.search(line):
            frames.append((frame.group(1), frame.group(2)))
        elif _CHAIN.search(line):
            chained = True
        elif found := _EXCEPTION.search(line):
            raised.append(_Raised(found.group(1), found.group(2) or "", frames, chained and bool(raised)))
            frames, chained = [], False
    return raised


def _faulthandler_frames(log_tail: str) -> list[tuple[str, str]]:
    dump = _FAULTHANDLER.search(log_tail or "")
    return list(reversed(_FRAME.findall(dump.group(1)))) if dump else []


def _site(frames: list[tuple[str, str]]) -> str | None:
    """`module:function` of the innermost vLLM frame (innermost last), else of the innermost frame."""
    if not frames:
        return None
    path, function = next((f for f in reversed(frames) if "/vllm/" in f[0].replace("\\", "/")), frames[-1])
    return f"{_module(path)}:{function}"


def _module(path: str) -> str:
    """A dotted module name that does not depend on where Python or vLLM is installed."""
    path = path.replace("\\", "/")
    if "/vllm/" in path:
        relative = "vllm/" + path.rsplit("/vllm/", 1)[1]
    else:
        relative = next((path.rsplit(marker, 1)[1] for marker in ("/site-packages/", "/dist-packages/")
                         if marker in path), "/".join(path.split("/")[-2:]))
    return relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
