"""Known failures, in the manner of TensorRT-LLM's `waives.txt`: one waiver a line, so a nightly failure that is
already reported upstream shows as `xfail` with its link instead of failing every night.

    # cell pattern                      GPU scope       link                                   expiry
    deepseek-mla[kv=fp8,*]              gpu=cpu,L4      https://github.com/vllm-project/vllm/issues/1   until=2027-01-31

- the pattern is a cell id in which `*` and `?` are wildcards (`[` and `]` are literal: cell ids contain them);
- `gpu=` (optional) limits the waiver to GPU classes, by name or glob, comma-separated;
- `vllm=` (optional) limits it to vLLM versions: a version, a glob or a range (`vllm=0.30.*`, `vllm=<0.31`), for a
  bug of some releases;
- the link (http:// or https://, or a section of the project's own findings, reports/findings/README.md#name) is
  required: a waiver says where the failure is tracked;
- `until=YYYY-MM-DD` (optional) is the last day the waiver holds; `#` after a space starts a comment;
- `finding=<name>` (optional) waives a finding by what vLLM does (vllm_compat/findings.py: its crash signature or
  failing check, in the configuration that triggers it) rather than by cell: the waiver then holds wherever that
  finding shows, in every case and on every class, within its `vllm=` releases, and nothing else there; the pattern
  and `gpu=` say which cells it was written for, and a match beyond them is reported (`beyond`), so that it is
  widened on purpose, not by accident.

The judge applies the waivers (`waive`, its last stage but one; a run resumed applies today's to the records it
keeps: harness/run/resume.py): a waived failure becomes `xfail` (its reason names the link). Over a run's records
(`waiver_problems`): a waived cell that passes is reported as "waiver can be removed"; a finding's waiver that
waived a cell it was not written for says where; an expired waiver waives nothing and is an error; a waiver that
matches no cell of the matrix is an error (a typo, or a cell that was renamed or removed).
"""

from __future__ import annotations

import datetime
import fnmatch
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvmatrix.harness.record.parts import FAILING_VERDICTS
from kvmatrix.harness.record.types import JudgedRecord, Waived
from kvmatrix.harness.vllm_compat import ENVIRONMENT_SIGNATURES, FINDING_SIGNATURES, signature_matches
from kvmatrix.matrix.conditions import check_condition_value, matches, when_matches
from kvmatrix.matrix.data_file import read_data_file
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.load import CASES_DIR
from kvmatrix.matrix.patterns import glob_fullmatch
from kvmatrix.matrix.schema import CaseError

WAIVERS_FILE = CASES_DIR / "_waivers.txt"
# Where a waived failure is tracked: an upstream issue, or our own findings page for bugs not yet filed upstream.
LINK_PREFIXES = ("http://", "https://", "reports/findings/")
_FIELDS = ("gpu=", "until=", "vllm=", "finding=")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_COMMENT = re.compile(r"(^|\s)#.*$")  # a `#` inside a link (a URL fragment) is not a comment


class WaiverError(ValueError):
    def __init__(self, file: str, line: int, message: str):
        super().__init__(f"{file}:{line}: {message}")
        self.file, self.line, self.message = file, line, message


@dataclass(frozen=True)
class Waiver:
    pattern: str
    link: str
    gpus: tuple[str, ...] = ()  # empty: every class
    until: datetime.date | None = None
    file: str = ""
    line: int = 0
    vllm: str | None = None  # a condition on the record's vLLM version (matrix/conditions.py); None: every version
    finding: str | None = None  # a finding of vllm_compat/findings.py: waived wherever it shows (module docstring)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def waives(self, record: JudgedRecord) -> bool:
        """Whether the waiver holds for a record: its cell, class and vLLM version; for a finding's waiver, the
        finding showing in it within the vLLM releases, whatever its case and class."""
        if self.finding is None:
            return self.matches(record["cell_id"], record.get("gpu_class") or "?", record.get("vllm_version"))
        version = record.get("vllm_version")
        return (self.vllm is None or version is None or matches(self.vllm, version)) and shows(self.finding, record)

    def beyond(self, record: JudgedRecord) -> bool:
        """Whether a finding's waiver holds for a record of a cell or class it was not written for."""
        return self.finding is not None and not self.matches(record["cell_id"], record.get("gpu_class") or "?")

    def matches(self, cell_id: str, gpu_class: str, vllm_version: str | None = None) -> bool:
        """`vllm_version` None (a cell of the matrix, not a record) matches every version scope."""
        return glob_fullmatch(self.pattern, cell_id) and (
            not self.gpus or any(fnmatch.fnmatchcase(gpu_class, g) for g in self.gpus)) and (
            self.vllm is None or vllm_version is None or matches(self.vllm, vllm_version))

    def expired(self, today: datetime.date) -> bool:
        return self.until is not None and today > self.until


def shows(finding: str, record: JudgedRecord) -> bool:
    """Whether a record shows the finding: in its configuration, the crash signature (or one of its family) or
    a failing row of the check."""
    known = FINDING_SIGNATURES[finding]
    if not when_matches(known.when, dict(record.get("axes") or {})):
        return False
    if known.signature is not None:
        return signature_matches(known.signature, record.get("signature"))
    return any(not row.get("ok") and str(row.get("rule", "")).startswith(f"{known.check}:")
               for row in record.get("expectations") or [])


def parse_waivers(text: str, file: str = "<waivers>", gpu_classes: Iterable[str] | None = None) -> list[Waiver]:
    """Every waiver of a file's text; the first mistake raises WaiverError naming file and line. With
    `gpu_classes` (the pool), a GPU scope that names no class is a mistake too."""
    known = list(gpu_classes) if gpu_classes is not None else None
    waivers: list[Waiver] = []
    seen: dict[tuple[str, tuple[str, ...], str | None], int] = {}
    # Lines as editors number them: "\n" only (str.splitlines also breaks at \x1e, \x85, \u2028, ...).
    for number, raw in enumerate(text.replace("\r\n", "\n").split("\n"), start=1):
        tokens = _COMMENT.sub("", raw).split()
        if not tokens:
            continue
        waiver = _parse_line(tokens, file, number, known)
        key = (waiver.pattern, waiver.gpus, waiver.vllm)
        if key in seen:
            raise WaiverError(file, number, f"{waiver.pattern!r} is already waived on line {seen[key]}")
        seen[key] = number
        waivers.append(waiver)
    return waivers


def _parse_line(tokens: list[str], file: str, number: int, known: list[str] | None) -> Waiver:
    def fail(message: str) -> WaiverError:
        return WaiverError(file, number, message)

    pattern, *rest = tokens
    if pattern.startswith((*_FIELDS, *LINK_PREFIXES)):
        raise fail(f"a line starts with the cell pattern, not {pattern!r}")
    fields = _fields(pattern, rest, fail)
    gpus, until = _gpus(fields, known, fail), _until(fields, fail)
    if "vllm" in fields and (problem := check_condition_value(fields["vllm"])):
        raise fail(f"vllm={fields['vllm']}: {problem}")
    if "finding" in fields and fields["finding"] not in FINDING_SIGNATURES:
        raise fail(f"finding={fields['finding']} is no known finding ({', '.join(sorted(FINDING_SIGNATURES))})")
    return Waiver(pattern, fields["link"], gpus, until, file, number, fields.get("vllm"), fields.get("finding"))


Fail = Callable[[str], WaiverError]


def _fields(pattern: str, tokens: list[str], fail: Fail) -> dict[str, str]:
    """A line's link and its gpu= / until= / vllm= fields, each at most once; the link is required."""
    fields: dict[str, str] = {}
    for token in tokens:
        name = ("link" if token.startswith(LINK_PREFIXES)
                else token.split("=", 1)[0] if token.startswith(_FIELDS) else None)
        if name is None:
            raise fail(f"unexpected {token!r}: expected gpu=<class>, vllm=<versions>, finding=<name>, a link "
                       f"(https://...) or until=YYYY-MM-DD")
        if name in fields:
            raise fail(f"more than one {name} for {pattern!r}")
        fields[name] = token if name == "link" else token.split("=", 1)[1]
    if "link" not in fields:
        raise fail(f"no link for {pattern!r}: a waiver says where the failure is tracked (https://...)")
    return fields


def _gpus(fields: dict[str, str], known: list[str] | None, fail: Fail) -> tuple[str, ...]:
    """The gpu= classes (globs), each naming some class of the pool where the pool is known."""
    gpus = tuple(fields["gpu"].split(",")) if "gpu" in fields else ()
    if "gpu" in fields and not all(gpus):
        raise fail(f"empty GPU class in gpu={fields['gpu']}")
    if known is not None:
        for glob in gpus:
            if not any(fnmatch.fnmatchcase(name, glob) for name in known):
                raise fail(f"gpu={glob} names no class of the pool ({', '.join(known)})")
    return gpus


def _until(fields: dict[str, str], fail: Fail) -> datetime.date | None:
    if "until" not in fields:
        return None
    if not _DATE.fullmatch(fields["until"]):
        raise fail(f"until={fields['until']} is not a date YYYY-MM-DD")
    try:
        return datetime.date.fromisoformat(fields["until"])
    except ValueError:
        raise fail(f"until={fields['until']} is not a real date") from None


def load_waivers(path: Path = WAIVERS_FILE, gpu_classes: Iterable[str] | None = None) -> list[Waiver]:
    try:
        data = read_data_file(Path(path))
    except CaseError as err:
        raise WaiverError(str(path), 0, err.message) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise WaiverError(str(path), data[:err.start].count(b"\n") + 1,
                          f"not UTF-8 text: byte 0x{data[err.start]:02x}") from None
    return parse_waivers(text, str(path), gpu_classes)


@dataclass(frozen=True)
class WaiverProblem:
    kind: str  # "expired" | "unmatched": errors; "removable": the waived cell no longer fails; "beyond": a
    # finding's waiver waived a cell it was not written for
    waiver: Waiver
    detail: str

    @property
    def is_error(self) -> bool:
        return self.kind not in ("removable", "beyond")

    def __str__(self) -> str:
        return f"{self.waiver.where}: {self.detail}"


def cell_keys(cells: Iterable[Cell]) -> list[tuple[str, str]]:
    """(cell id, GPU class) of every cell of the matrix: what a waiver must match to be of any use."""
    return [(cell.cell_id, gpu) for cell in cells for gpu in cell.gpu_classes]


def waiver_for(record: JudgedRecord, waivers: Iterable[Waiver]) -> Waiver | None:
    """The first waiver that holds for a record (`Waiver.waives`), one written for its cell and class before one
    of a finding that holds there beyond them."""
    holding = [w for w in waivers if w.waives(record)]
    return next((w for w in holding if not w.beyond(record)), holding[0] if holding else None)


def unwaived(record: JudgedRecord) -> JudgedRecord:
    """A record as judged before any waiver (itself where none applied): waiving is applied afresh each time."""
    waived = record.get("waived")
    if not isinstance(waived, dict):
        return record
    prefix = f"waived ({_said(waived.get('finding'), waived.get('link'))}): "
    reason = record.get("reason") or ""
    out = record.copy()
    del out["waived"]
    out.update({"verdict": waived.get("verdict", record["verdict"]), "reason": reason.removeprefix(prefix)})
    return out


def waive(record: JudgedRecord, waivers: Iterable[Waiver], today: datetime.date | None = None
          ) -> tuple[JudgedRecord, WaiverProblem | None]:
    """(the record with the first matching waiver applied, a "removable" problem or None). A waived failure
    becomes `xfail` naming the link; an expired waiver only says so in the reason. The input is not changed."""
    today = today or datetime.date.today()
    record = unwaived(record)
    waiver = waiver_for(record, waivers)
    if waiver is None:
        return record, None
    where = f"{record['cell_id']} @{record.get('gpu_class')}"
    if waiver.expired(today):
        said = f"waiver expired on {waiver.until} ({waiver.link}): "
        if record["verdict"] in FAILING_VERDICTS and not record.get("reason", "").startswith(said):
            return {**record, "reason": said + record.get("reason", "")}, None  # said once, however often waived
        return record, None
    if record["verdict"] == "error" and record.get("signature") in ENVIRONMENT_SIGNATURES:
        # A broken install is mended, not waived: a waiver for vLLM's failure must not hide it (seen: a B200 waiver
        # over a record of the install without `quack`).
        return record, None
    if record["verdict"] in FAILING_VERDICTS:
        return _waived(record, waiver)
    if record["verdict"] == "pass":
        return record, WaiverProblem("removable", waiver, f"waiver can be removed: {where} passes")
    if record["verdict"] == "xfail":
        return record, WaiverProblem("removable", waiver,
                                     f"waiver can be removed: the case already expects {where} to fail")
    return record, None


def _waived(record: JudgedRecord, waiver: Waiver) -> tuple[JudgedRecord, WaiverProblem | None]:
    """The failing record as the waiver makes it `xfail`; a finding's waiver names the finding, and where it
    holds beyond the cells it was written for, says so in the record and as a (non-error) problem."""
    waived = Waived(verdict=record["verdict"], waiver=waiver.where, link=waiver.link)
    if waiver.finding is not None:
        waived["finding"] = waiver.finding
    problem = None
    if waiver.beyond(record):
        waived["beyond"] = True
        problem = WaiverProblem("beyond", waiver, f"finding {waiver.finding} waived {record['cell_id']} "
                                                  f"@{record.get('gpu_class')}, beyond {waiver.pattern}"
                                                  f"{' gpu=' + ','.join(waiver.gpus) if waiver.gpus else ''}")
    return {**record, "verdict": "xfail", "reason": f"waived ({_said(waiver.finding, waiver.link)}): "
                                                    f"{record.get('reason', '')}", "waived": waived}, problem


def _said(finding: str | None, link: str | None) -> str:
    """What a waived record's reason names: the finding (its name and site) where the waiver is a finding's, and
    the link."""
    known = FINDING_SIGNATURES.get(finding or "")
    return f"{known.title} at {known.site}, {link}" if known else str(link)


def waiver_problems(
    records: Iterable[JudgedRecord],
    waivers: Sequence[Waiver],
    today: datetime.date | None = None,
    known_cells: Iterable[tuple[str, str]] | None = None,
) -> list[WaiverProblem]:
    """The waivers' problems over a run's records (judged: the waivers are applied by the judge, `waive`): expired,
    removable (a waived cell that passes, or that its case already expects to fail), matching no cell.
    `known_cells` is the whole matrix (`cell_keys(cells)`); without it, the records' own cells are the matrix, so
    a waiver for a class this run did not cover counts as unmatched."""
    today = today or datetime.date.today()
    records = list(records)
    problems = [WaiverProblem("expired", w, f"waiver for {w.pattern} expired on {w.until} ({w.link})")
                for w in waivers if w.expired(today)]
    problems += [problem for record in records if (problem := waive(record, waivers, today)[1]) is not None]
    keys = {(r["cell_id"], r.get("gpu_class") or "?") for r in records} | set(known_cells or ())
    for w in waivers:
        if not any(w.matches(*key) for key in keys):
            hint = "" if "[" in w.pattern or "*" in w.pattern else " (cell ids end in [...]: use a * for a case)"
            problems.append(WaiverProblem("unmatched", w, f"waiver for {w.pattern} matches no cell{hint}"))
    return problems
