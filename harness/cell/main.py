"""One cell in its own process: start vLLM with the spec's engine arguments, probe what it resolved, generate.

    python -m kvmatrix.harness.cell SPEC.json RESULT.json

The parent owns timeouts, kills and verdicts. This process only records, and rewrites RESULT.json (atomically)
when each phase starts and ends, so a segfault or kill mid-phase still leaves everything learned before it and
the phase it died in. The probe runs before generation: a cell whose decode crashes keeps its resolved state.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import platform
import re
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from kvmatrix.harness import vllm_compat
from kvmatrix.harness.cell import forced, spec_decode, workloads
from kvmatrix.harness.cell.probe import probe
from kvmatrix.harness.cell.spec import CellSpec
from kvmatrix.harness.cell.vllm_import import import_vllm
from kvmatrix.harness.record.files import write_json_atomic
from kvmatrix.harness.record.types import CellOutput, ExceptionInfo, Reference, check_cell_output

MESSAGE_CAP = 4096
TRACEBACK_CAP = 4096
# Each phase of the cell process and the record's timing of it.
PHASE_TIMINGS: dict[str, Literal["import_s", "init_s", "probe_s", "generate_s", "forced_s", "references_s",
                                  "accuracy_s"]] = {
    "import": "import_s", "init": "init_s", "probe": "probe_s", "generate": "generate_s", "forced": "forced_s",
    "references": "references_s", "accuracy": "accuracy_s"}


class CellResult:
    def __init__(self, path: Path, cell_id: str):
        self.path = path
        self.data = CellOutput(
            cell_id=cell_id,
            vllm_version=vllm_compat.installed_vllm_version(),
            torch_version=None,
            python=platform.python_version(),
            status="ok",
            phase="import",
            exception=None,
            timings={},
            emulation=None,
            worker_cache_dtype=None,
            tokens=[],
            texts=[],
            layers=[],
            kv_groups=[],
            attn_groups=[],
            probe_error=None,
        )
        self.cpu_started = cpu_seconds()

    def save(self) -> None:
        write_json_atomic(self.path, check_cell_output(self.data, str(self.path)))

    def run(self, phase: str, step: Callable[[], Any]) -> tuple[bool, Any]:
        """Run one phase; on an exception, record it as the cell's crash. Returns (succeeded, value)."""
        self.data["phase"] = phase
        self.save()
        started = time.monotonic()
        try:
            return True, step()
        except (Exception, SystemExit) as exc:  # vLLM exits on some init errors; that is a crash too
            traceback.print_exc()  # the log keeps the whole chain; the classifier reads its tail
            self.data["status"] = "crash"
            self.data["exception"] = describe(exc)
            return False, None
        finally:
            self.data["timings"][PHASE_TIMINGS[phase]] = round(time.monotonic() - started, 3)
            self.data["timings"]["cpu_s"] = round(cpu_seconds() - self.cpu_started, 1)
            self.save()


def cpu_seconds() -> float:
    """User and system time of this process and of its children it has reaped (a JIT's compiler processes)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def describe(exc: BaseException) -> ExceptionInfo:
    formatted = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:MESSAGE_CAP],
        "traceback_tail": formatted[-TRACEBACK_CAP:],
    }


# Engine arguments whose product is the number of engine processes (ranks) vLLM starts.
RANK_ARGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


def start_engine(vllm: Any, engine_args: dict[str, Any]) -> Any:
    """The cell's engine. With one rank the engine lives in this process, which forks no engine process, so vLLM's
    model-class inspections run here instead of in a child importing torch and vLLM again (see
    harness/vllm_compat/registry.py); with several, vLLM inspects as it always does."""
    ranks = 1
    for name in RANK_ARGS:
        ranks *= int(engine_args.get(name) or 1)
    if ranks > 1:
        return vllm.LLM(**engine_args)
    with vllm_compat.model_info_in_process(vllm.__version__):
        return vllm.LLM(**engine_args)


@contextmanager
def logged_lines(logger: str, patterns: list[str]) -> Iterator[list[str]]:
    """While inside, the messages logged by `logger` and the loggers under it that match a pattern, in order. Read
    where log records are made, not by a handler: vLLM configures its logging while the engine starts, which
    removes handlers from its loggers."""
    found: list[str] = []
    make_record = logging.getLogRecordFactory()
    reading = True

    def keeping(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        if reading and (record.name == logger or record.name.startswith(logger + ".")):
            message = record.getMessage()
            if any(re.search(p, message) for p in patterns):
                found.append(message)
        return record

    logging.setLogRecordFactory(keeping)
    try:
        yield found
    finally:
        # vLLM (0.32+) wraps the factory it finds when it configures logging, at the first engine start of a
        # process: putting back the one found here would drop vLLM's wrapper, which adds the `vllm_process_name`
        # its format needs, and every later message of a warm worker would fail to format (KeyError). Ours is
        # taken out only where it is still the outermost; inside a wrapper it stays, reading nothing.
        reading = False
        if logging.getLogRecordFactory() is keeping:
            logging.setLogRecordFactory(make_record)


def start_engine_noting(result: CellResult, vllm: Any, engine_args: dict[str, Any]) -> Any:
    """The cell's engine, keeping vLLM's words where it replaces a forced attention backend."""
    patterns = vllm_compat.for_version(vllm_compat.BACKEND_REPLACED_LOG, result.data["vllm_version"])
    with logged_lines(vllm_compat.VLLM_LOGGER, patterns) as notes:
        try:
            return start_engine(vllm, engine_args)
        finally:
            if notes:
                result.data["backend_notes"] = list(notes)


def prepare_engine_start(vllm: Any) -> None:
    """Before the engine: vLLM's log-once memory emptied, so a warm worker's cell logs its engine's timings and
    notes as a fresh process does (harness/vllm_compat/phase_log.py reads them); and every object alive now (the
    imports, ~750,000 objects with torch and vLLM) frozen out of the garbage collector. vLLM collects fully
    while the engine starts (three times around the model load alone, vllm/utils/mem_utils.py
    DeviceMemoryProfiler), each pass walking them all: 1.1 s on the 2-core CPU, 3-4 s of a warm H200 cell's
    `Model loading took` for a tiny model. Frozen objects are only skipped, never lost: vLLM's own teardown
    unfreezes and collects them after the cell, and a process that ends needs no collection."""
    vllm_compat.forget_logged_once(vllm.__version__)
    gc.freeze()


def probe_engine(result: CellResult, llm: Any) -> None:
    """Record the resolved state; a probe failure is the harness's problem, not the cell's crash."""
    try:
        states = llm.collective_rpc(probe)  # one per rank
    except Exception:
        traceback.print_exc()
        result.data["probe_error"] = traceback.format_exc()[-TRACEBACK_CAP:]
        return
    result.data.update(states[0])
    if len(states) > 1:
        result.data["ranks"] = [{"rank": i, "layers": s["layers"], "kv_groups": s["kv_groups"]}
                                for i, s in enumerate(states)]


def generate(result: CellResult, vllm: Any, llm: Any, prompts: list[str], max_tokens: int,
             logprobs: int | None = None) -> None:
    # ignore_eos: every cell emits exactly max_tokens, so greedy outputs compare position by position.
    params = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                 **({"logprobs": logprobs} if logprobs else {}))
    outputs = llm.generate(prompts, params, use_tqdm=False)
    result.data["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
    result.data["texts"] = [o.outputs[0].text for o in outputs]
    if logprobs:
        result.data["logprobs"] = workloads.outputs_of(outputs, logprobs)["logprobs"]


def generate_workload(result: CellResult, vllm: Any, llm: Any, workload: dict[str, Any], max_tokens: int,
                      logprobs: int | None) -> None:
    """The workload's generation instead of the plain one (harness/cell/workloads.py)."""
    got, facts = workloads.run_workload(vllm, llm, workload, result.data, max_tokens, logprobs)
    result.data["workload_run"] = facts
    result.data["tokens"], result.data["texts"] = got.get("tokens", []), got.get("texts", [])
    if "logprobs" in got:
        result.data["logprobs"] = got["logprobs"]
    if "cached_tokens" in got:
        result.data["workload_run"]["cached_tokens"] = got["cached_tokens"]


def generate_references(result: CellResult, vllm: Any, llm: Any, spec: CellSpec) -> None:
    """As an oracle: each workload's prompts generated plainly, for the cells compared with this one."""
    references: dict[str, Reference] = {}
    for params in spec.references:
        assert params is not None, "an oracle's references are its cells' workloads, never plain (matrix/expand.py)"
        references[params["name"]] = workloads.run_reference(vllm, llm, params, result.data, spec.max_tokens,
                                                             spec.logprobs)
    result.data["references"] = references


def measure_accuracy(result: CellResult, llm: Any, accuracy: dict[str, Any]) -> None:
    from kvmatrix.harness.cell.lm_eval_engine import evaluate  # lm_eval is needed by accuracy cases only

    result.data["accuracy"] = evaluate(llm, accuracy)


def after_probe(result: CellResult, vllm: Any, llm: Any, spec: CellSpec) -> Iterator[tuple[str, Callable[[], Any]]]:
    """The phases after the probe, in order, each (name, step): the generation, the teacher-forced decodes, an
    oracle's references, accuracy. Asked one at a time: whether a phase runs may depend on the ones before."""
    workload, accuracy = spec.workload, spec.accuracy
    drafting = bool(spec.engine_args.get("speculative_config"))
    counted = spec_decode.counters(llm, result.data["vllm_version"]) if drafting else None

    def generate_counted() -> None:
        if workload is None:
            generate(result, vllm, llm, spec.prompts, spec.max_tokens, spec.logprobs)
        else:
            generate_workload(result, vllm, llm, workload, spec.max_tokens, spec.logprobs)
        if drafting:  # the acceptance of this generation alone, before any forced decode drafts again
            after = spec_decode.counters(llm, result.data["vllm_version"])
            result.data["spec_decode"] = spec_decode.acceptance(counted, after)

    yield "generate", generate_counted
    if forced.wants_forced_decode(spec, result.data):
        yield "forced", lambda: forced.forced_decode(result.data, vllm, llm, spec)
    if spec.references:
        yield "references", lambda: generate_references(result, vllm, llm, spec)
    if accuracy is not None:
        yield "accuracy", lambda: measure_accuracy(result, llm, dataclasses.asdict(accuracy))


def main(spec_path: str, result_path: str) -> int:
    spec = CellSpec.read(Path(spec_path))
    result = CellResult(Path(result_path), spec.cell_id)
    ok, vllm = result.run("import", lambda: import_vllm(result.data, spec.emulate_capability, spec.emulate_cpu_isa))
    if not ok:
        return 1
    prepare_engine_start(vllm)
    ok, llm = result.run("init", lambda: forced.start_with_forcing(
        lambda args: start_engine_noting(result, vllm, args), spec, result.data["vllm_version"], result.data))
    if not ok:
        return 1
    result.run("probe", lambda: probe_engine(result, llm))
    for phase, step in after_probe(result, vllm, llm, spec):
        ok, _ = result.run(phase, step)
        if not ok:
            return 1
    result.data["phase"] = "done"
    result.save()
    return 0

