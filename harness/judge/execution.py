"""Whether a cell ran as it was asked to: its execution mode as vLLM resolved it (compilation, CUDA graphs) and a
workload cell's runtime path (a prefix reused, a prompt chunked, a request preempted). A cell that did not tested
nothing, and is an `error`; a downgraded CUDA-graph mode is noted. Also how a record's cell ran (`mode_of`), which
names a differential pair's two sides (differential.py)."""

from __future__ import annotations

from kvmatrix.harness.judge.verdict import Judgement
from kvmatrix.harness.record.types import OutcomeRecord
from kvmatrix.matrix.axes import resolved_execution

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
