"""Which observation a minimal reproducer makes for each kind of rule a case can hold (matrix/expectations.py's
`expect:` fields and the case's `differential:`), and the rules of a cell in the forms its script checks them:

- `runs`: the engine starts and generates (`crash: false`), or refuses at start in words the case accepts
  (`refuse:`);
- `crash`: the exception it fails with is the named signature the case expects (`crash: {signature: ...}`);
- `state`: read inside the engine as the record reads it: each attention layer (numbered by the first number in its
  name, the drafter's own layers the draft), its KV-cache group's spec, its metadata builder's dtypes (`layers:`,
  `groups:`, `builders:`, `page_size_ratio:`);
- `tokens`: the greedy tokens against the same configuration run eager (`tokens:`, `differential:`).

A kind this table does not name is an error (ReproError), never a rule left out of the script."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvmatrix.harness import vllm_compat
from kvmatrix.harness.repro.generate import ReproError
from kvmatrix.matrix.conditions import is_range, when_matches
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.expectations import CrashExpected, Expectation

OBSERVATIONS = ("runs", "crash", "state", "tokens")
# Every field of an `expect:` rule but `when`, with the observation that checks it.
RULE_OBSERVATION = {"refuse": "runs", "crash": "runs", "layers": "state", "groups": "state", "builders": "state",
                    "page_size_ratio": "state", "tokens": "tokens"}
STATE_RULES = ("layers", "groups", "builders")  # checks of records of these kinds, each by the layers it selects
WEIGHTED_FIELDS = ("k_scale", "v_scale")  # layer fields whose values come from a checkpoint's weights, not its config


def needs_weights(checks: list[dict[str, Any]]) -> bool:
    """Whether a state check reads what only written weights hold (the checkpoint's KV scales)."""
    return any(f in WEIGHTED_FIELDS for c in checks if c["rule"] == "layers" for f in c["wanted"])


def kinds_of(rule: Expectation) -> list[str]:
    """The kinds of check one rule holds; a field the table above does not know is an error."""
    kinds = [name for name in type(rule).model_fields if name != "when" and getattr(rule, name) is not None]
    unknown = [k for k in kinds if k not in RULE_OBSERVATION]
    if unknown:
        raise ReproError(f"a rule of kind {unknown[0]!r} has no observation a minimal script makes")
    return kinds


def observation_of_kind(rule: Expectation, kind: str) -> str:
    return "crash" if kind == "crash" and isinstance(rule.crash, CrashExpected) else RULE_OBSERVATION[kind]


def applicable(cell: Cell, context: dict) -> list[Expectation]:
    return [rule for rule in cell.case.expect if when_matches(rule.when, context)]


def observations(cell: Cell, context: dict) -> set[str]:
    """What the cell's applicable rules need observed (a known crash's cell: that crash, not a clean run)."""
    found = {observation_of_kind(rule, kind) for rule in applicable(cell, context) for kind in kinds_of(rule)}
    return found - {"runs"} if "crash" in found else found


def _wanted(values: Any, where: str) -> list:
    wanted = values if isinstance(values, list) else [values]
    if any(is_range(v) for v in wanted):
        raise ReproError(f"{where}: a range of versions is no value a script compares with; use --full")
    return [str(v) if isinstance(v, str) else v for v in wanted]


def state_checks(cell: Cell, context: dict) -> list[dict[str, Any]]:
    """The applicable layers / groups / builders / page-size rules as data: each names its kind, the layers it
    selects (a selector word, or indices as the record numbers them) and the values wanted (globs kept)."""
    checks: list[dict[str, Any]] = []
    for rule in applicable(cell, context):
        for kind in STATE_RULES:
            check = getattr(rule, kind)
            if check is not None:
                wanted = {field: _wanted(value, f"{cell.cell_id} {kind}.{field}")
                          for field, value in check.wanted().items()}
                checks.append({"rule": kind, "select": check.select, "wanted": wanted})
        if rule.page_size_ratio is not None:
            ratio = rule.page_size_ratio
            checks.append({"rule": "page_size_ratio", "select": ratio.of, "to": ratio.to, "equals": ratio.equals})
    return checks


def signature_patterns(names: list[str], version: str | None) -> list[str]:
    """The patterns vLLM's messages of these signatures match (a family standing for its members)."""
    return list(dict.fromkeys(p for name, versions, patterns in vllm_compat.SIGNATURES
                              if any(vllm_compat.signature_matches(n, name) for n in names)
                              and vllm_compat.version_matches(version, versions) for p in patterns))


def refusals(cell: Cell, context: dict, version: str | None) -> tuple[list[str], bool]:
    """(what a clear refusal at start says, as regular expressions; whether the case requires one)."""
    names, required = [], False
    for rule in applicable(cell, context):
        if rule.refuse is not None:
            names += rule.refuse.names
            required = required or not rule.refuse.optional
    return signature_patterns(names, version), required


def known_crash(cell: Cell, context: dict, version: str | None) -> dict[str, Any] | None:
    """The crash the case expects of the cell (its signature, the patterns of its message), if any."""
    for rule in applicable(cell, context):
        if isinstance(rule.crash, CrashExpected):
            patterns = signature_patterns([rule.crash.signature], version)
            if not patterns:
                raise ReproError(f"{cell.cell_id}: signature {rule.crash.signature!r} has no message pattern for "
                                 f"vLLM {version}")
            return {"signature": rule.crash.signature, "patterns": patterns}
    return None


def failed_observation(record: Mapping[str, Any]) -> str | None:
    """What a judged record failed on, as an observation: its crash (against the case's known crash, or none), a
    rule on the resolved state, or the tokens against its oracle; None where nothing failed."""
    unmet = [e.get("rule", "") for e in record.get("expectations") or [] if not e.get("ok")]
    if any("'crash': {" in rule for rule in unmet):
        return "crash"
    if record.get("error_tail") or record.get("crash"):
        return "runs"
    if any(f"'{kind}':" in rule for rule in unmet for kind in (*STATE_RULES, "page_size_ratio")):
        return "state"
    if any(rule.startswith("differential") or "'tokens':" in rule for rule in unmet):
        return "tokens"
    return None
