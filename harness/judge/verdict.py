"""Expectations → verdict. Pure logic over a cell record: no vLLM here.

A cell is
- `pass` when an applicable `refuse:` rule expects vLLM to reject the configuration and it did, with that
  signature (a clear refusal is correct behaviour);
- `xfail` when it crashed with the signature an applicable `crash:` rule expects (a known failure, with its link)
  and every other applicable check holds;
- `fail` when it crashed unexpectedly, timed out, was killed, crashed with another signature than expected,
  ran although a crash was expected (the failure is gone: update the case), or a check does not hold;
- `error` when the harness could not observe the cell (no result from the cell process, a probe fault);
- `pass` otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvmatrix.harness.judge.fingerprint import failure_name
from kvmatrix.harness.record.types import Layer, OutcomeRecord, RankState, RuleResult, Verdict
from kvmatrix.harness.vllm_compat import boundary_keeps_every_layer, signature_matches
from kvmatrix.matrix.conditions import matches, when_matches
from kvmatrix.matrix.expectations import CrashExpected, Expectation, PageSizeRatio, RecordCheck, RefusalExpected


@dataclass(frozen=True)
class Judgement:
    """A record's verdict under its case's expectations, why, and the result of each applicable rule; as the
    judge's later stages (judge.py) go on from it, the fields each adds to the record too (`accuracy_vs_baseline`,
    `differential`, ...), in the order they are added: the judged record's JSON keeps that order."""

    verdict: Verdict
    reason: str
    results: list[RuleResult]
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def then(self, verdict: Verdict | None = None, reason: str | None = None, rows: Iterable[RuleResult] = (),
             fields: Mapping[str, Any] | None = None) -> Judgement:
        """The judgement after a stage: its verdict and reason where given (else as they were), with the stage's
        rule results and record fields added. A new value: a stage never changes the one it was given."""
        return Judgement(self.verdict if verdict is None else verdict, self.reason if reason is None else reason,
                         [*self.results, *rows], {**self.fields, **(fields or {})})


def select_layers(record: OutcomeRecord, selector: str | list[int], skip_layers: list[str]) -> list[Layer]:
    layers = record.get("layers") or []
    if isinstance(selector, list):
        return [la for la in layers if la.get("index") in selector]
    skipped = {str(s) for s in skip_layers}
    pick = {
        "all": lambda la: True,
        "target": lambda la: la.get("role") == "target",
        "draft": lambda la: la.get("role") == "draft",
        "skipped": lambda la: str(la.get("index")) in skipped,
        "not_skipped": lambda la: str(la.get("index")) not in skipped,
    }[selector]
    return [la for la in layers if pick(la)]


def _describe(selector: str | list[int]) -> str:
    return f"layers {selector}" if isinstance(selector, list) else f"{selector} layers"


def _check_values(items: Sequence[tuple[str, Mapping[str, Any]]], wanted: dict[str, Any]) -> tuple[bool, str]:
    """Each (name, values) item must match every wanted field; the detail names the first mismatch."""
    for name, values in items:
        for field, cond in wanted.items():
            if field not in values:
                return False, f"{name}: no {field} recorded"
            if not matches(cond, values[field]):
                return False, f"{name}: {field} is {values[field]!r}, expected {cond!r}"
    return True, f"{len(items)} checked"


def _check_layers(record: OutcomeRecord, check: RecordCheck, skip: list[str]) -> tuple[bool, str]:
    layers = select_layers(record, check.select, skip)
    if not layers:
        return False, f"no {_describe(check.select)} recorded"
    return _check_values([(la["name"], la) for la in layers], check.wanted())


def _check_groups(record: OutcomeRecord, check: RecordCheck, skip: list[str]) -> tuple[bool, str]:
    names = {la["name"] for la in select_layers(record, check.select, skip)}
    groups = [g for g in record.get("kv_groups") or [] if names & set(g.get("layer_names") or [])]
    if not groups:
        return False, f"no KV-cache group holds {_describe(check.select)}"
    return _check_values([(f"kv group {g.get('group')}", g) for g in groups], check.wanted())


def _check_builders(record: OutcomeRecord, check: RecordCheck, skip: list[str]) -> tuple[bool, str]:
    names = {la["name"] for la in select_layers(record, check.select, skip)}
    groups = [g for g in record.get("attn_groups") or [] if names & set(g.get("layer_names") or [])]
    if not groups:
        return False, f"no attention group holds {_describe(check.select)}"
    items: list[tuple[str, Mapping[str, Any]]] = [
        (f"{g.get('backend')} builder (group {g.get('group')})", g.get("builder") or {}) for g in groups]
    return _check_values(items, check.wanted())


def _page_size(record: OutcomeRecord, selector: str | list[int], skip: list[str]) -> tuple[int | None, str]:
    sizes = [la.get("page_size_bytes") for la in select_layers(record, selector, skip)]
    if not sizes or None in sizes:
        return None, f"no page size recorded for {_describe(selector)}"
    known = {size for size in sizes if size is not None}
    if len(known) > 1:
        return None, f"{_describe(selector)} have several page sizes {sorted(known)}"
    return known.pop(), ""


def _check_page_ratio(record: OutcomeRecord, ratio: PageSizeRatio, skip: list[str]) -> tuple[bool, str]:
    num, why = _page_size(record, ratio.of, skip)
    den, why_den = _page_size(record, ratio.to, skip)
    if num is None or den is None:
        return False, why or why_den
    ok = abs(num / den - ratio.equals) < 1e-9
    return ok, f"page size {_describe(ratio.of)} {num} / {_describe(ratio.to)} {den} = {num / den:g}" + (
        "" if ok else f", expected {ratio.equals:g}"
    )


def _describe_rule(rule: Expectation) -> str:
    return str(rule.model_dump(exclude_defaults=True, exclude_none=True))


# What every rank of a multi-GPU cell must resolve alike for each attention layer it holds (KV heads are split
# over ranks, so page sizes may differ with the split but not between ranks).
RANK_FIELDS = ("kv_cache_dtype", "backend", "spec_dtype", "page_size_bytes")
RANKS_RULE = "every rank resolves each layer alike (built in)"


def _check_ranks(ranks: list[RankState]) -> tuple[bool, str]:
    """Ranks that disagree with rank 0 on a layer's dtype, backend, spec dtype or page size."""
    first = {layer["name"]: layer for layer in ranks[0].get("layers") or []}
    for rank in ranks[1:]:
        for layer in rank.get("layers") or []:
            theirs = first.get(layer["name"])
            if theirs is None:
                continue  # pipeline ranks hold different layers
            for field in RANK_FIELDS:
                if layer.get(field) != theirs.get(field):
                    return False, (f"rank {rank['rank']} {layer['name']}: {field} {layer.get(field)!r}, rank 0 "
                                   f"{theirs.get(field)!r}")
    return True, f"{len(ranks)} ranks agree"


FORCED_BACKEND_RULE = "a forced attention backend is the one that runs (built in)"


def _check_forced_backend(record: OutcomeRecord, forced: str) -> tuple[bool, str]:
    """The target's attention layers run the backend the cell forced (a draft may need another one)."""
    ran = sorted({backend for la in record.get("layers") or []
                  if (backend := la.get("backend")) and la.get("role", "target") == "target"})
    replaced = [b for b in ran if b != forced]
    if replaced:
        return False, f"forced attention backend {forced}, vLLM ran {', '.join(replaced)} instead"
    return True, f"forced {forced} runs"


def judge(record: OutcomeRecord, rules: list[Expectation], context: dict[str, Any]) -> Judgement:
    """One record's verdict under the case's expectations (those whose `when` holds in `context`)."""
    applicable = [r for r in rules if when_matches(r.when, context)]
    results, expected_crash = check_expectations(record, applicable, context.get("kv_cache_dtype_skip_layers") or [],
                                                 has_draft="speculative" not in context or bool(context["speculative"]))
    if record.get("ranks"):
        ok, detail = _check_ranks(record["ranks"])
        results.append({"rule": RANKS_RULE, "ok": ok, "detail": detail})
    forced = context.get("attention_backend")
    if forced and record.get("layers"):
        ok, detail = _check_forced_backend(record, forced)
        if not ok and record.get("backend_notes"):
            # The platform says it cannot offer the backend (and ran another): nothing this cell claims to test ran.
            return Judgement("skip", f"{detail}: the platform cannot offer it (vLLM: {record['backend_notes'][0]})",
                             results)
        results.append({"rule": FORCED_BACKEND_RULE, "ok": ok, "detail": detail})
    unobserved = _unobserved(record)
    if unobserved is not None:
        return Judgement("error", unobserved, results)
    failed = [r for r in results if not r["ok"] and r["detail"] != "crashed"]
    if expected_crash is not None and not (record.get("status") == "ok" and getattr(expected_crash[0], "optional",
                                                                                       False)):
        if (unexercised := _dtype_on_no_layer(record, context)) is not None:
            return Judgement("skip", unexercised, results)
        return _against_expected_crash(record, results, failed, *expected_crash)
    return Judgement(*_without_expected_crash(record, results, failed), results)


ExpectedCrash = tuple[CrashExpected | RefusalExpected, str]  # the rule's crash or refusal, and the rule's text


def check_expectations(record: OutcomeRecord, applicable: list[Expectation], skip: list[str], has_draft: bool = True
                       ) -> tuple[list[RuleResult], ExpectedCrash | None]:
    """Every applicable check's result, and the crash or refusal a rule expects (it decides with the status)."""
    results: list[RuleResult] = []
    expected_crash: ExpectedCrash | None = None
    for rule in applicable:
        text = _describe_rule(rule)
        expected = rule.refuse if rule.refuse is not None else rule.crash
        if isinstance(expected, (CrashExpected, RefusalExpected)):
            expected_crash = (expected, text)
            continue
        if rule.crash is False:
            ok = record.get("status") == "ok"
            results.append({"rule": text, "ok": ok, "detail": "no crash" if ok else "crashed"})
        if record.get("status") != "ok" and not record.get("layers"):
            continue  # nothing was observed to check; the crash itself decides
        results += [{"rule": text, "ok": ok, "detail": detail}
                    for ok, detail in _record_checks(record, rule, skip, has_draft)]
    return results, expected_crash


def _record_checks(record: OutcomeRecord, rule: Expectation, skip: list[str], has_draft: bool
                   ) -> list[tuple[bool, str]]:
    """(ok, detail) of each of a rule's checks on the resolved state: layers, groups, builders, page sizes."""
    checks = [check(record, getattr(rule, name), skip)
              for name, check in (("layers", _check_layers), ("groups", _check_groups), ("builders", _check_builders))
              if getattr(rule, name) is not None and _applies(getattr(rule, name).select, has_draft)]
    ratio = rule.page_size_ratio
    if ratio is not None and _applies(ratio.of, has_draft) and _applies(ratio.to, has_draft):
        checks.append(_check_page_ratio(record, ratio, skip))
    return checks


def _applies(selector: str | list[int], has_draft: bool) -> bool:
    """A check of the draft's layers says nothing of a cell without a draft (a draft cell's no-draft twin, which
    the harness adds to the draft's case); on a cell with a draft it holds, and no draft layer fails it."""
    return selector != "draft" or has_draft


def _dtype_on_no_layer(record: OutcomeRecord, context: dict[str, Any]) -> str | None:
    """Why a cell that ran never exercised the KV dtype it asked for (a refusal of it can neither happen nor be
    missed), or None: vLLM kept every attention layer at the model's dtype by its own boundary rule."""
    asked = (record.get("engine_args") or {}).get("kv_cache_dtype") or ""
    layers = [layer for layer in record.get("layers") or [] if layer.get("role", "target") == "target"]
    if record.get("status") != "ok" or not layers or any(layer.get("kv_cache_dtype") == asked for layer in layers):
        return None
    kept = boundary_keeps_every_layer(asked, len(layers), context.get("vllm_version"))
    if kept is None:
        return None
    return (f"not exercised: vLLM keeps the first and last {kept} attention layers at the model's dtype under "
            f"{asked}, and this model has {len(layers)}, so no layer used it")


def _unobserved(record: OutcomeRecord) -> str | None:
    """Why the harness could not observe the cell (an error verdict), or None."""
    if record.get("status") == "error":
        return record.get("error_tail") or "the harness could not observe this cell"
    if record.get("probe_error") and record.get("status") == "ok":
        return f"probe failed: {record['probe_error']}"
    return None


def _against_expected_crash(record: OutcomeRecord, results: list[RuleResult], failed: list[RuleResult],
                            crash: CrashExpected | RefusalExpected, text: str) -> Judgement:
    status, signature, name = record.get("status"), record.get("signature"), failure_name(record)
    refusal = isinstance(crash, RefusalExpected)
    what = "refusal" if refusal else "failure"
    link = f" ({crash.link})" if isinstance(crash, CrashExpected) and crash.link else ""
    got = status == "crash" and any(signature_matches(n, signature) for n in crash.names)
    observed = f"{status} {name or ''}".strip() if status != "ok" else "no crash"
    results.append({"rule": text, "ok": got, "detail": f"expected {what} {crash.signature}, got {observed}"})
    if status == "ok":
        return Judgement("fail", f"expected {what} {crash.signature}{link} did not happen: the cell ran", results)
    # A failed check is named first: the expected crash (or another one) may well follow from it, while the
    # check says what vLLM resolved wrong (a skipped layer quantized, a page size).
    if failed:
        also = "" if got else f"; and crashed with {name or status}, expected {crash.signature}{link}"
        return Judgement("fail", failed[0]["detail"] + also, results)
    if not got:
        return Judgement("fail", f"crashed with {name or status}, expected {crash.signature}{link}", results)
    if refusal:
        return Judgement("pass", f"refused as expected: {signature}: {record.get('error_tail', '')}", results)
    member = f" ({signature})" if signature != crash.signature else ""
    return Judgement("xfail", f"expected failure {crash.signature}{member}{link}", results)


def _without_expected_crash(record: OutcomeRecord, results: list[RuleResult], failed: list[RuleResult]
                            ) -> tuple[Verdict, str]:
    status = record.get("status")
    if status == "timeout":
        return "fail", f"timed out: {record.get('error_tail')}"
    if status == "killed":
        return "fail", record.get("error_tail") or "killed"
    if status == "crash":
        return "fail", f"crash [{failure_name(record)}] {record.get('error_tail') or ''}".strip()
    if failed:
        return "fail", failed[0]["detail"]
    return "pass", f"{len(results)} checks hold" if results else "ran; no checks apply"
