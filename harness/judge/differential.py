"""Differential cells: a cell whose execution or workload differs from its oracle's (the same configuration run
eager and plain; matrix/expectations.py Differential, matrix/expand.py `Cell.oracle_on`) against the oracle's
record, passed in once both exist (the oracle runs first, as an accuracy baseline does; record/neighbours.py).

In order:
- a crash (or refusal) in one of the two only fails, naming the mode that crashed;
- the resolved state must be identical: every layer's KV dtype, backend, spec dtype and page size, every KV-cache
  group, every attention builder's dtypes;
- where the case gives each prompt's answer (a model that learned a task), the free-running answers, paired with
  the oracle's, must not drop significantly (answers.py);
- the greedy tokens must agree with the oracle's tokens for the same prompts (for a workload, the prompts the oracle
  generated plainly as its `references`): exactly where an `expect:` rule says `tokens: exact`; else, where the
  cell decoded its oracle's tokens teacher-forced, the distance of its next-token distributions from the oracle's
  must stay within what the oracle's noise floor allows (teacher_forced.py: the rule and its numbers), the
  free-running tokens being reported as the user's evidence; else (no forced decode: speculative decoding, older
  records) closely (`compare_tokens`); accuracy cells also compare their samples, paired, as with the accuracy
  baseline.
Before all that, a workload cell must have taken its runtime path (`workload_run.reached`): one that did not (a
prefix that was not reused, a prompt that was not chunked, no preemption) tested nothing, and is an `error`.
Only a cell that otherwise passes is turned into a failure by the comparison; its results are kept either way.
"""

from __future__ import annotations

from typing import Any

from kvmatrix.harness.judge.accuracy import compare as compare_accuracy
from kvmatrix.harness.judge.accuracy import describe as describe_accuracy
from kvmatrix.harness.judge.answers import compare_answers
from kvmatrix.harness.judge.answers import describe as describe_answers
from kvmatrix.harness.judge.teacher_forced import floor_of, floor_problem, judge_forced, unusable
from kvmatrix.harness.judge.verdict import Judgement
from kvmatrix.harness.record.files import run_mode
from kvmatrix.harness.record.types import (
    AccuracyComparison,
    DifferentialComparison,
    JudgedRecord,
    KvGroup,
    OutcomeRecord,
    Reference,
    RuleResult,
    TokenComparison,
    Verdict,
)
from kvmatrix.harness.vllm_compat.declarations import UNQUANTIZED_KV_DTYPES
from kvmatrix.matrix.axes import resolved_execution
from kvmatrix.matrix.conditions import when_matches
from kvmatrix.matrix.expand import Cell
from kvmatrix.matrix.expectations import Differential

LAYER_STATE = ("kv_cache_dtype", "backend", "spec_dtype", "page_size_bytes", "group")
GROUP_STATE = ("layer_names", "spec_type", "dtype", "block_size", "page_size_bytes", "kv_quant_mode",
               "cache_dtype_str")
WORKLOAD_RULE = "the workload takes its runtime path (built in)"
EXECUTION_RULE = "the engine executes as asked (built in)"


def execution_problem(record: OutcomeRecord, gpu_device: str | None) -> tuple[str, bool] | None:
    """(what vLLM resolved against the cell's execution, whether that means the cell tested nothing), or None
    where it executes as asked. vLLM may turn compilation or CUDA graphs off for a configuration, or downgrade a
    CUDA-graph mode; a record without `runtime` (older harness) says nothing."""
    runtime = record.get("runtime")
    axes = record.get("axes") or {}
    if not runtime or "execution" not in axes:
        return None
    execution = resolved_execution(axes["execution"], gpu_device)
    compiled = not runtime.get("enforce_eager") and runtime.get("compilation_mode") not in (None, "NONE")
    graphs = runtime.get("cudagraph_mode") not in (None, "NONE")
    if execution == "eager":
        return (f"eager asked, vLLM resolved compilation {runtime.get('compilation_mode')}", False) if compiled \
            else None
    if not compiled and graphs and execution.startswith("graphs"):
        # vLLM 0.33.0 turns torch.compile off for some models (sparse MLA on the H200) and captures breakable CUDA
        # graphs of the eager model instead: graphs ran, compiled code did not.
        return (f"{execution} asked, vLLM captured CUDA graphs ({runtime.get('cudagraph_mode')}) without "
                f"torch.compile (compilation {runtime.get('compilation_mode')})", False)
    if not compiled:
        return f"{execution} asked, vLLM ran eager (compilation {runtime.get('compilation_mode')})", True
    if execution.startswith("graphs") and not graphs:
        return f"{execution} asked, vLLM captured no CUDA graphs (cudagraph_mode NONE)", True
    # FULL_AND_PIECEWISE contains the word but is not FULL (seen: vLLM 0.33.0 on an emulated A100 and L4, FULL asked).
    if execution == "graphs_full" and runtime.get("cudagraph_mode") != "FULL":
        return f"graphs_full asked, vLLM downgraded to {runtime.get('cudagraph_mode')}", False
    return None


def mode_of(record: OutcomeRecord, gpu_device: str | None) -> str:
    """How the record's cell ran: its execution (as its class runs `default`) and workload. A record from before
    the axes ran eager and plain, as every cell did then."""
    axes = record.get("axes") or {}
    if "execution" not in axes:
        return "eager/plain"
    execution = resolved_execution(axes["execution"], gpu_device)
    return f"{execution}/{axes.get('workload', 'plain')}"


def judge_workload(record: OutcomeRecord, judgement: Judgement, gpu_device: str | None = None) -> Judgement:
    """A cell that ran but not in its execution mode, or a workload cell that did not take its runtime path, is an
    `error` (it observed nothing); a downgraded CUDA-graph mode is noted."""
    problem = execution_problem(record, gpu_device) if record.get("status") == "ok" else None
    if problem is not None:
        text, tested_nothing = problem
        judgement = judgement.then(rows=[{"rule": EXECUTION_RULE, "ok": not tested_nothing, "detail": text}])
        if tested_nothing and judgement.verdict == "pass":
            return judgement.then("error", f"did not execute as asked: {text}")
    facts = record.get("workload_run")
    if not facts or record.get("status") != "ok":
        return judgement
    judgement = judgement.then(rows=[{"rule": WORKLOAD_RULE, "ok": bool(facts.get("reached")),
                                      "detail": facts.get("detail", "")}])
    if facts.get("reached") or judgement.verdict != "pass":
        return judgement
    return judgement.then("error", f"workload {facts.get('name')} did not take its runtime path: "
                                   f"{facts.get('detail')}")


def state_differences(mine: OutcomeRecord, theirs: OutcomeRecord) -> list[str]:
    """Where two records' resolved state differs (empty: identical)."""
    return [*_layer_differences(mine, theirs), *_kv_group_differences(mine, theirs),
            *_attention_group_differences(mine, theirs)]


def _layer_differences(mine: OutcomeRecord, theirs: OutcomeRecord) -> list[str]:
    out: list[str] = []
    layers = {la["name"]: la for la in theirs.get("layers") or []}
    mine_layers = {la["name"]: la for la in mine.get("layers") or []}
    if set(layers) != set(mine_layers):
        out.append(f"layers {sorted(mine_layers)} vs the oracle's {sorted(layers)}")
    for name in sorted(set(layers) & set(mine_layers)):
        for field in LAYER_STATE:
            if mine_layers[name].get(field) != layers[name].get(field):
                out.append(f"{name}: {field} {mine_layers[name].get(field)!r}, oracle {layers[name].get(field)!r}")
    return out


def _kv_group_differences(mine: OutcomeRecord, theirs: OutcomeRecord) -> list[str]:
    out: list[str] = []
    groups: list[KvGroup] = theirs.get("kv_groups") or []
    mine_groups: list[KvGroup] = mine.get("kv_groups") or []
    if len(groups) != len(mine_groups):
        out.append(f"{len(mine_groups)} KV-cache groups, oracle {len(groups)}")
    for g, (a, b) in enumerate(zip(mine_groups, groups, strict=False)):
        for field in GROUP_STATE:
            if a.get(field) != b.get(field):
                out.append(f"kv group {g}: {field} {a.get(field)!r}, oracle {b.get(field)!r}")
    return out


def _attention_group_differences(mine: OutcomeRecord, theirs: OutcomeRecord) -> list[str]:
    out: list[str] = []
    builders = {(x.get("group"), x.get("subgroup")): x for x in theirs.get("attn_groups") or []}
    for group in mine.get("attn_groups") or []:
        other = builders.get((group.get("group"), group.get("subgroup")))
        if other is None:
            out.append(f"attention group {group.get('group')}: not in the oracle")
            continue
        if group.get("backend") != other.get("backend"):
            out.append(f"attention group {group.get('group')}: backend {group.get('backend')!r}, oracle "
                       f"{other.get('backend')!r}")
        a, b = group.get("builder") or {}, other.get("builder") or {}
        for field in sorted((set(a) | set(b)) - {"module"}):
            if a.get(field) != b.get(field):
                out.append(f"{group.get('backend')} builder (group {group.get('group')}): {field} {a.get(field)!r}, "
                           f"oracle {b.get(field)!r}")
    return out


def _lp(position: dict[str, float] | None, token: int) -> float | None:
    return None if position is None else position.get(str(token))


def _lead(position: dict[str, float] | None, chosen: int, other: int) -> list[float]:
    """[logprob of the chosen token - the other's] at one position, or [] where the other's is not recorded."""
    other_lp = _lp(position, other)
    if other_lp is None:
        return []
    chosen_lp = _lp(position, chosen)
    assert chosen_lp is not None, "a position's logprobs hold the token chosen there"
    return [chosen_lp - other_lp]


def compare_sequence(mine: list[int], theirs: list[int], mine_lp: list[dict] | None, theirs_lp: list[dict] | None,
                     exact: bool, logprob_tolerance: float, tie_tolerance: float) -> dict[str, Any]:
    """One sequence against the oracle's: the first divergent token (index, the oracle's and this cell's), the
    largest difference of a chosen token's logprob before it, and whether they agree (exact: the same tokens; else
    close: logprobs within tolerance up to the divergence, and the divergence a near tie)."""
    index = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
    if index is None and len(mine) != len(theirs):
        index = min(len(mine), len(theirs))
    out: dict[str, Any] = {"first_divergence": index}
    if index is not None:
        out["oracle_token"] = theirs[index] if index < len(theirs) else None
        out["token"] = mine[index] if index < len(mine) else None
    if exact:
        out["ok"] = index is None
        return out
    if not mine_lp or not theirs_lp:
        out["ok"] = index is None
        out["note"] = "no logprobs recorded: compared exactly"
        return out
    upto = len(mine) if index is None else index
    deltas = [abs(a - b) for i in range(min(upto, len(mine_lp), len(theirs_lp)))
              if (a := _lp(mine_lp[i], mine[i])) is not None and (b := _lp(theirs_lp[i], theirs[i])) is not None]
    out["max_logprob_delta"] = round(max(deltas), 5) if deltas else 0.0
    ok = out["max_logprob_delta"] <= logprob_tolerance
    if index is not None:
        # How far each side's chosen token is ahead of the other's, where the other's is among its logprobs.
        gaps = []
        if out["token"] is not None and index < len(theirs_lp):
            gaps += _lead(theirs_lp[index], out["oracle_token"], out["token"])
        if out["oracle_token"] is not None and index < len(mine_lp):
            gaps += _lead(mine_lp[index], out["token"], out["oracle_token"])
        out["tie_gap"] = round(min(abs(g) for g in gaps), 5) if gaps else None
        ok = ok and out["tie_gap"] is not None and out["tie_gap"] <= tie_tolerance
    out["ok"] = ok
    return out


# The close rule of one sequence, every function it calls: `kvmatrix repro` copies them into a script verbatim.
SEQUENCE_RULE = (_lp, _lead, compare_sequence)


def compare_tokens(mine: OutcomeRecord | Reference, theirs: Reference, exact: bool, rule: Differential
                   ) -> TokenComparison:
    """Every sequence of `mine` (tokens, logprobs) against `theirs`: per-sequence results, and the first that does
    not agree."""
    mine_lp, theirs_lp = mine.get("logprobs") or [], theirs.get("logprobs") or []
    sequences = [compare_sequence(a, b, mine_lp[s] if mine_lp else None, theirs_lp[s] if theirs_lp else None,
                                  exact, rule.logprob_tolerance, rule.tie_tolerance)
                 for s, (a, b) in enumerate(zip(mine["tokens"], theirs["tokens"], strict=False))]
    out: TokenComparison = {"exact": exact, "sequences": len(sequences),
                            "identical": sum(1 for s in sequences if s["first_divergence"] is None),
                            "per_sequence": sequences}
    if len(mine["tokens"]) != len(theirs["tokens"]):
        out["ok"] = False
        out["detail"] = f"{len(mine['tokens'])} sequences, the oracle {len(theirs['tokens'])}"
        return out
    bad = next((s for s, seq in enumerate(sequences) if not seq["ok"]), None)
    out["ok"] = bad is None
    out["detail"] = describe_tokens(sequences, bad, exact, rule)
    return out


def describe_tokens(sequences: list[dict], bad: int | None, exact: bool, rule: Differential) -> str:
    identical = sum(1 for s in sequences if s["first_divergence"] is None)
    head = f"{identical}/{len(sequences)} sequences identical" + (" (exact)" if exact else "")
    if bad is None:
        deltas = [s.get("max_logprob_delta") or 0.0 for s in sequences]
        return head + (f", logprobs within {max(deltas):.3g} of the oracle's" if not exact and deltas else "")
    seq = sequences[bad]
    text = f"{head}; sequence {bad}"
    if seq["first_divergence"] is not None:
        text += (f" first diverges at token {seq['first_divergence']}: oracle {seq['oracle_token']}, this cell "
                 f"{seq['token']}")
        if not exact:
            gap = seq.get("tie_gap")
            if gap is None:
                text += " (not a near tie: neither token is in the other run's top logprobs)"
            elif gap > rule.tie_tolerance:
                text += f" (not a near tie: logprob gap {gap:.3g} > {rule.tie_tolerance:g})"
    if not exact and (seq.get("max_logprob_delta") or 0) > rule.logprob_tolerance:
        text += (f"; a chosen token's logprob differs by {seq['max_logprob_delta']:.3g} from the oracle's "
                 f"(tolerance {rule.logprob_tolerance:g})")
    return text


def describe_free_running(sequences: list[dict]) -> str:
    """The free-running tokens as evidence, judging nothing: how many sequences are identical and where the first
    of the others diverges."""
    identical = sum(1 for s in sequences if s["first_divergence"] is None)
    text = f"{identical}/{len(sequences)} sequences identical"
    first = next(((i, s) for i, s in enumerate(sequences) if s["first_divergence"] is not None), None)
    if first is not None:
        i, seq = first
        text += (f"; sequence {i} first diverges at token {seq['first_divergence']} (oracle {seq['oracle_token']}, "
                 f"this cell {seq['token']})")
    return text


def _tokens_exact(cell: Cell, context: dict[str, Any]) -> bool:
    rules = [r for r in cell.case.expect if r.tokens is not None and when_matches(r.when, context)]
    return bool(rules) and rules[-1].tokens == "exact"


def _crashed(record: OutcomeRecord) -> bool:
    return record.get("status") in ("crash", "timeout", "killed")


def _failure(record: OutcomeRecord) -> str:
    return record.get("signature") or record.get("fingerprint") or record.get("status") or "?"


def judge_differential(record: OutcomeRecord, judgement: Judgement, cell: Cell, oracle: JudgedRecord | None,
                       gpu_name: str, gpu_device: str | None, context: dict[str, Any]) -> Judgement:
    """The judgement after the comparison with the cell's `oracle` record (None: not in the run): with
    `differential` for the record and its rows."""
    rule = cell.case.differential
    oracle_id = cell.oracle_on(gpu_name)
    if rule is False or oracle_id is None:
        return judgement
    mode = mode_of(record, gpu_device)
    oracle_mode = f"{rule.oracle.execution}/{rule.oracle.workload}"
    if mode == oracle_mode:  # a record that ran as its oracle would (one from before the axes): nothing to compare
        return judgement
    pair = f"{mode} vs its oracle {oracle_id} ({oracle_mode})"
    comparison: DifferentialComparison = {"oracle": oracle_id, "mode": mode, "oracle_mode": oracle_mode}
    rows: list[RuleResult] = []
    verdict, reason = _differential(record, oracle, cell, rule, context, pair, comparison, rows, judgement)
    return judgement.then(verdict, reason, rows, {"differential": comparison})


def _differential(record: OutcomeRecord, oracle: JudgedRecord | None, cell: Cell, rule: Differential,
                  context: dict[str, Any], pair: str, comparison: DifferentialComparison, rows: list[RuleResult],
                  judgement: Judgement) -> tuple[Verdict, str]:
    """(verdict, reason) after the pair's comparison (into `comparison` and `rows`)."""
    verdict, reason, oracle_mode = judgement.verdict, judgement.reason, comparison["oracle_mode"]
    title = f"differential: {pair}"
    missing = _missing(record, oracle)
    if missing:
        comparison["missing"] = missing
        rows.append({"rule": title, "ok": True, "detail": missing})
        return verdict, f"{reason}; not compared with its oracle: {missing}"
    assert oracle is not None, "an absent oracle is missing"
    if _crashed(record) or _crashed(oracle):
        ok, detail = _crash_comparison(record, oracle, comparison["mode"], oracle_mode)
        comparison["crash"] = detail
        rows.append({"rule": title, "ok": ok, "detail": detail})
        return (verdict, reason) if ok else ("fail", f"differential {pair}: {detail}")
    failures = _compared(record, oracle, cell, rule, context, title, comparison, rows)
    if failures and verdict in ("pass", "xfail"):
        return "fail", f"differential {pair}: {failures[0]}"
    if verdict == "pass" and "teacher_forced" in comparison:
        return verdict, (f"{reason}; as its oracle ({oracle_mode}): {comparison['teacher_forced']['detail']}; "
                         f"free-running: {comparison['tokens']['detail']}")
    if verdict == "pass" and "tokens" in comparison:
        return verdict, f"{reason}; as its oracle ({oracle_mode}): {comparison['tokens']['detail']}"
    return verdict, reason


ORACLE_FLOOR_RULE = "an oracle's decode is reproducible: its noise floor (built in)"


def judge_oracle_floor(record: OutcomeRecord, judgement: Judgement, cell: Cell, gpu_name: str) -> Judgement:
    """An oracle's own noise floor (its tokens decoded again, forced, in another batch), summarized into the record
    (`noise_floor_summary`); an oracle whose decode moves with the batch beyond what numerics allow fails: every
    cell compared with it would be compared with noise."""
    rule = cell.case.differential
    noise = record.get("noise_floor")
    if rule is False or not cell.is_oracle_on(gpu_name) or not noise or record.get("status") != "ok":
        return judgement
    floor, missing = floor_of(record.get("tokens") or [], record.get("logprobs") or [], noise, rule.tie_tolerance)
    if floor is None:
        return judgement.then(fields={"noise_floor_summary": {"missing": missing}})
    problem = floor_problem(floor)
    judgement = judgement.then(
        rows=[{"rule": ORACLE_FLOOR_RULE, "ok": problem is None,
               "detail": problem or f"distance {floor['typical']:.3g} typical, {floor['flips']} top-1 flips "
                                    f"over {floor['positions']} positions in another batch"}],
        fields={"noise_floor_summary": {**floor, "ok": problem is None}})
    if problem is not None and judgement.verdict in ("pass", "xfail"):
        return judgement.then("fail", f"as an oracle: {problem}")
    return judgement


def _crash_comparison(record: OutcomeRecord, oracle: JudgedRecord, mode: str, oracle_mode: str) -> tuple[bool, str]:
    """Where one of the pair crashed: both crashing is no difference (their failures named), one alone is."""
    if _crashed(record) != _crashed(oracle):
        crashed, ran = (mode, oracle_mode) if _crashed(record) else (oracle_mode, mode)
        name = _failure(record if _crashed(record) else oracle)
        return False, f"crashes under {crashed} only ({name}); {ran} runs"
    same = _failure(record) == _failure(oracle)
    return True, f"both crash ({_failure(record)}" + ("" if same else f", the oracle {_failure(oracle)}") + ")"


def _compared(record: OutcomeRecord, oracle: JudgedRecord, cell: Cell, rule: Differential, context: dict[str, Any],
              title: str, comparison: DifferentialComparison, results: list[RuleResult]) -> list[str]:
    """The pair's resolved state, greedy tokens and accuracy compared (into `comparison` and `results`); what
    differs, first failure first."""
    failures: list[str] = []
    differences = state_differences(record, oracle)
    comparison["state"] = differences
    results.append({"rule": f"{title}: resolved state identical", "ok": not differences,
                    "detail": differences[0] if differences else "identical"})
    if differences:
        failures.append(f"resolved state differs: {differences[0]}")
    failures += _compared_answers(record, oracle, cell, title, comparison, results)
    paired = _paired_accuracy(record, oracle, cell, comparison["oracle"])
    accuracy = cell.case.accuracy if paired is not None and "missing" not in paired else None
    theirs = _oracle_outputs(record, oracle)
    if isinstance(theirs, str):
        comparison["tokens_missing"] = theirs
        results.append({"rule": f"{title}: greedy tokens agree", "ok": True, "detail": theirs})
    else:
        failures += _compared_tokens(record, oracle, theirs, _tokens_exact(cell, context), accuracy is not None,
                                     rule, title, comparison, results)
    if paired is not None:
        comparison["accuracy"] = paired
    if paired is not None and accuracy is not None:
        dropped = paired["significant"] and paired["delta"] < -accuracy.max_drop
        results.append({"rule": f"{title}: accuracy", "ok": not dropped, "detail": describe_accuracy(paired)})
        if dropped:
            failures.append(f"significant accuracy drop: {describe_accuracy(paired)}")
    return failures


def _compared_tokens(record: OutcomeRecord, oracle: JudgedRecord, theirs: Reference, exact: bool,
                     has_accuracy: bool, rule: Differential, title: str, comparison: DifferentialComparison,
                     results: list[RuleResult]) -> list[str]:
    """The greedy tokens compared, and where the pair may differ numerically (the close rule) and the cell decoded
    its oracle's tokens teacher-forced, that comparison (harness/judge/teacher_forced.py) decides instead: the
    free-running tokens stay the user's evidence. What fails, first failure first."""
    tokens = compare_tokens(record, theirs, exact, rule)
    comparison["tokens"] = tokens
    forced = None if exact else _teacher_forced(record, oracle, theirs, rule, comparison)
    if forced is not None:
        tokens["detail"] = describe_free_running(tokens["per_sequence"])
        results.append({"rule": f"{title}: free-running greedy tokens (evidence)", "ok": True,
                        "detail": tokens["detail"]})
        results.append({"rule": f"{title}: teacher-forced distance within the noise floor's allowance",
                        "ok": forced["ok"], "detail": forced["detail"]})
        return [] if forced["ok"] else [forced["detail"]]
    # Where numerics may differ (the close rule) and the pair's samples were compared, the paired accuracy judges
    # them: two probe prompts' logprobs near a tolerance are noise beside 200 paired samples (seen on the H200:
    # the clipping fp8 checkpoint, identical tokens, one logprob 0.102 off, accuracy within its bound).
    judged_by_accuracy = not exact and has_accuracy
    ok = tokens["ok"] or judged_by_accuracy
    detail = tokens["detail"] + ("" if tokens["ok"] or not ok else "; the paired accuracy judges this pair")
    results.append({"rule": f"{title}: greedy tokens agree", "ok": ok, "detail": detail})
    return [] if ok else [tokens["detail"]]


def _teacher_forced(record: OutcomeRecord, oracle: JudgedRecord, theirs: Reference, rule: Differential,
                    comparison: DifferentialComparison) -> dict[str, Any] | None:
    """The teacher-forced comparison (into `comparison`), or None where the pair has none (said why, except for a
    record made before cells decoded forced: it is judged as it was)."""
    if "forced" not in record:
        return None
    problem = unusable(record.get("forced"), theirs)
    if problem is not None:
        comparison["teacher_forced_missing"] = problem
        return None
    forced = record["forced"]
    floor, floor_missing = floor_of(oracle.get("tokens") or [], oracle.get("logprobs") or [],
                                    oracle.get("noise_floor"), rule.tie_tolerance)
    result = judge_forced(forced, theirs, floor, floor_missing, kv_kind(record), rule.tie_tolerance)
    comparison["teacher_forced"] = result
    return result


def kv_kind(record: OutcomeRecord) -> str:
    """"quantized" where any layer resolved a quantized KV dtype (an fp8 checkpoint's `auto` too), else
    "unquantized"."""
    dtypes = {layer.get("kv_cache_dtype") for layer in record.get("layers") or []} - {None}
    return "quantized" if dtypes - set(UNQUANTIZED_KV_DTYPES) else "unquantized"


def _compared_answers(record: OutcomeRecord, oracle: JudgedRecord, cell: Cell, title: str,
                      comparison: DifferentialComparison, results: list[RuleResult]) -> list[str]:
    """Where the case gives each prompt's answer, the cell's free-running answers paired with the oracle's: a
    significant drop fails."""
    answers = cell.case.generate.answers
    if not answers or (record.get("workload_run") or {}).get("name"):
        return []
    paired = compare_answers(record.get("texts") or [], oracle.get("texts") or [], answers)
    if paired is None:
        return []
    comparison["answers"] = paired
    results.append({"rule": f"{title}: answers", "ok": not paired["dropped"], "detail": describe_answers(paired)})
    return [f"significant answer drop: {describe_answers(paired)}"] if paired["dropped"] else []


def _paired_accuracy(record: OutcomeRecord, oracle: JudgedRecord, cell: Cell, oracle_id: str
                     ) -> AccuracyComparison | None:
    """The pair's samples compared, paired, or why not (None: not an accuracy cell, or a side has no samples)."""
    if cell.case.accuracy is None or not record.get("accuracy") or not oracle.get("accuracy"):
        return None
    return compare_accuracy(record, oracle, oracle_id, cell.case.accuracy.confidence)


def _missing(record: OutcomeRecord, oracle: JudgedRecord | None) -> str | None:
    """Why the pair cannot be compared (None: it can)."""
    if oracle is None:
        return "the oracle has no record in this run"
    if oracle.get("status") == "skipped":
        return f"the oracle was skipped ({oracle.get('reason')})"
    if oracle.get("status") == "error" or record.get("status") == "error":
        return "the harness could not observe " + ("the oracle" if oracle.get("status") == "error" else "this cell")
    if run_mode(oracle) != run_mode(record):
        return f"the oracle ran in {run_mode(oracle)} mode, this cell in {run_mode(record)} mode"
    return None


def _oracle_outputs(record: OutcomeRecord, oracle: JudgedRecord) -> Reference | str:
    """The oracle's generation of this cell's prompts (its own, or its reference run of this cell's workload), or
    why there is none."""
    workload = (record.get("workload_run") or {}).get("name")
    if workload is None:
        return {"tokens": oracle.get("tokens") or [], "logprobs": oracle.get("logprobs") or []}
    reference = (oracle.get("references") or {}).get(workload)
    if not reference:
        return f"the oracle generated no {workload} reference"
    if "missing" in reference:
        return f"the oracle's {workload} reference: {reference['missing']}"
    return reference
