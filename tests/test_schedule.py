"""Scheduling: baselines first, the last run's failures first within each wave, cells sharing a model and backend
together, longest first by the last run's timings from the history; `run_locally` starts cells in that order and
still returns them in the given one."""

from __future__ import annotations

import dataclasses
import json
import sys
import tarfile
import time
from pathlib import Path

import pytest

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.results import history
from kvmatrix.harness.run import model_builds
from kvmatrix.harness.run.executor.local import run_locally
from kvmatrix.harness.run.order.longest_first import order_tasks
from kvmatrix.harness.run.order.pilots import kernel_family, mark_warm, pilot_gates, warm_families
from kvmatrix.harness.run.order.policy import PastRuns
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.load import load_case, load_models, load_pool
from tests.conftest import FIXTURES, shipped_matrix, write_case

CPU = "cpu-avx512"  # any class: the cells here run a fake cell process

FAKE_CELL = (sys.executable, str(Path(__file__).with_name("fake_cell.py")))


def tasks_of(cases_dir, name, matrix, model="llama"):
    path = write_case(cases_dir, name, {"model": model, "gpus": [CPU], "matrix": matrix})
    pool = load_pool(cases_dir)
    return [Task(c, CPU, pool[CPU]) for c in expand_case(load_case(path), load_models(cases_dir), pool)]


def ids(tasks):
    return [t.cell.cell_id for t in tasks]


def test_longest_first_within_groups_of_model_and_backend(cases_dir):
    tasks = tasks_of(cases_dir, "a", {"kv_cache_dtype": ["auto", "fp8"], "attention_backend": [None, "TRITON_ATTN"]})
    tasks += tasks_of(cases_dir, "b", {"kv_cache_dtype": ["auto", "fp8"]}, model="ct-llama")
    expected = {"a[kv=auto,skip=-,spec=-,attn=-]": 10, "a[kv=fp8,skip=-,spec=-,attn=-]": 30,
                "a[kv=auto,skip=-,spec=-,attn=TRITON_ATTN]": 5, "a[kv=fp8,skip=-,spec=-,attn=TRITON_ATTN]": 8,
                "b[kv=auto,skip=-,spec=-]": 40}  # b[kv=fp8] was never timed: the default, 60 s
    assert ids(order_tasks(tasks, expected)) == [
        "b[kv=fp8,skip=-,spec=-]", "b[kv=auto,skip=-,spec=-]",  # the group holding the longest cell
        "a[kv=fp8,skip=-,spec=-,attn=-]", "a[kv=auto,skip=-,spec=-,attn=-]",
        "a[kv=fp8,skip=-,spec=-,attn=TRITON_ATTN]", "a[kv=auto,skip=-,spec=-,attn=TRITON_ATTN]",
    ]


def test_unknown_costs_keep_the_given_order(cases_dir):
    tasks = tasks_of(cases_dir, "a", {"kv_cache_dtype": ["auto", "bfloat16", "fp8"]})
    assert ids(order_tasks(tasks, {})) == ids(tasks)


def test_baselines_start_before_every_compared_cell(cases_dir):
    tasks = tasks_of(cases_dir, "a", {"kv_cache_dtype": ["fp8", "bfloat16", "auto"]})
    baseline = "a[kv=auto,skip=-,spec=-]"
    tasks = [dataclasses.replace(t, cell=dataclasses.replace(t.cell, baseline_id=baseline)) for t in tasks]
    ordered = order_tasks(tasks, {baseline: 1, "a[kv=fp8,skip=-,spec=-]": 50, "a[kv=bfloat16,skip=-,spec=-]": 5})
    assert ids(ordered) == [baseline, "a[kv=fp8,skip=-,spec=-]", "a[kv=bfloat16,skip=-,spec=-]"]


def test_last_timings_are_the_latest_run_that_timed_each_cell(tmp_path):
    db = history.open_db(tmp_path / "h.sqlite")

    def rec(cell, run, day, total_s, gpu="cpu"):
        return {"cell_id": cell, "run_id": run, "gpu_class": gpu, "verdict": "pass",
                "finished_at": f"2026-11-{day:02d}T02:00:00Z", "timings": {"total_s": total_s}}

    history.import_records(db, [rec("x", "night-2", 2, 20.0), rec("y", "night-2", 2, 7.0),
                                rec("x", "h", 2, 99, "H200")])
    history.import_records(db, [rec("x", "night-1", 1, 10.0), rec("z", "night-1", 1, 3.0)])
    history.import_records(db, [{**rec("y", "night-3", 3, 0), "timings": {}}])  # a skip: never timed
    assert history.last_timings(db, "cpu") == {"x": 20.0, "y": 7.0, "z": 3.0}


@pytest.mark.parametrize(("expected_s", "last_verdicts"), [
    ({"ok[kv=fp8,skip=-,spec=-]": 9.0, "ok[kv=auto,skip=-,spec=-]": 1.0}, None),  # longest first
    ({"ok[kv=auto,skip=-,spec=-]": 9.0, "ok[kv=fp8,skip=-,spec=-]": 1.0},
     {"ok[kv=fp8,skip=-,spec=-]": "fail"}),  # last run's failure first, though shorter
], ids=["longest-first", "last-failures-first"])
def test_run_tasks_starts_in_schedule_order_and_returns_in_given_order(cases_dir, tmp_path, expected_s,
                                                                       last_verdicts):
    write_case(cases_dir, "ok", {"model": "llama", "gpus": [CPU],
                                 "matrix": {"kv_cache_dtype": ["auto", "fp8", "bfloat16"]}})
    pool, models = load_pool(cases_dir), load_models(cases_dir)
    tasks = [Task(c, CPU, pool[CPU]) for c in expand_case(load_case(cases_dir / "ok.yaml"), models, pool)]
    settings = RunSettings(run_dir=RunDir(tmp_path / "run"), models=models, built={"llama": cases_dir},
                           vllm_version="fake", cache_dir=tmp_path / "cache", cell_command=FAKE_CELL)
    started: list[str] = []
    records = run_locally(tasks, settings, on_record=lambda r, *_: started.append(r["cell_id"]),
                          past=PastRuns(expected_s, last_verdicts or {}))
    # The model reference (bf16) first, whatever its time: the other cells wait for it; then the schedule's order.
    assert started == ["ok[kv=bfloat16,skip=-,spec=-]", "ok[kv=fp8,skip=-,spec=-]", "ok[kv=auto,skip=-,spec=-]"]
    assert [r["cell_id"] for r in records] == ids(tasks) and all(r["verdict"] == "pass" for r in records)


def test_cells_that_failed_last_time_start_first_within_each_wave(cases_dir):
    tasks = tasks_of(cases_dir, "a", {"kv_cache_dtype": ["auto", "bfloat16", "fp8", "fp8_e5m2"]})
    baseline = "a[kv=auto,skip=-,spec=-]"
    tasks = [dataclasses.replace(t, cell=dataclasses.replace(t.cell, baseline_id=baseline)) for t in tasks]
    tasks += tasks_of(cases_dir, "b", {"kv_cache_dtype": ["auto", "fp8"]}, model="ct-llama")
    expected = {baseline: 1, "a[kv=bfloat16,skip=-,spec=-]": 50, "a[kv=fp8,skip=-,spec=-]": 5,
                "a[kv=fp8_e5m2,skip=-,spec=-]": 2, "b[kv=auto,skip=-,spec=-]": 3, "b[kv=fp8,skip=-,spec=-]": 1}
    last = {baseline: "pass", "a[kv=fp8,skip=-,spec=-]": "fail", "b[kv=fp8,skip=-,spec=-]": "error",
            "a[kv=fp8_e5m2,skip=-,spec=-]": "xfail"}  # an expected failure is no news: it keeps its place
    assert ids(order_tasks(tasks, expected, last_verdicts=last)) == [
        baseline,  # compared cells need their baseline's record: baselines still come first
        "a[kv=fp8,skip=-,spec=-]", "b[kv=fp8,skip=-,spec=-]",  # failed last time, longest first
        "a[kv=bfloat16,skip=-,spec=-]", "a[kv=fp8_e5m2,skip=-,spec=-]", "b[kv=auto,skip=-,spec=-]",
    ]


def test_last_verdicts_are_each_cells_latest_run(tmp_path):
    db = history.open_db(tmp_path / "h.sqlite")

    def rec(cell, run, day, verdict, gpu="cpu"):
        return {"cell_id": cell, "run_id": run, "gpu_class": gpu, "verdict": verdict,
                "finished_at": f"2026-11-{day:02d}T02:00:00Z"}

    history.import_records(db, [rec("x", "night-2", 2, "fail"), rec("y", "night-2", 2, "pass"),
                                rec("x", "h", 3, "pass", "H200")])
    history.import_records(db, [rec("x", "night-1", 1, "pass"), rec("z", "night-1", 1, "error")])
    # A skipped cell has no finish time of its own: its run's finish places it.
    history.import_records(db, [rec("w", "night-3", 3, "pass"),
                                {**rec("y", "night-3", 3, "skip"), "finished_at": None}])
    assert history.last_verdicts(db, "cpu") == {"x": "fail", "y": "skip", "z": "error", "w": "pass"}


def test_pilots_warm_each_kernel_family_once_and_only_their_family_waits(cases_dir):
    tasks = tasks_of(cases_dir, "a", {"kv_cache_dtype": ["auto", "fp8"], "attention_backend": [None, "TRITON_ATTN"]})
    tasks += tasks_of(cases_dir, "b", {"kv_cache_dtype": ["auto", "fp8", "fp8_e5m2", "bfloat16"]})
    tasks += tasks_of(cases_dir, "c", {"kv_cache_dtype": ["fp8"], "kv_cache_dtype_skip_layers": [[], ["0"]]})
    tasks += tasks_of(cases_dir, "d", {"kv_cache_dtype": ["auto", "fp8"]}, model="ct-llama")
    ordered, waits = pilot_gates(tasks, warm_families=set())
    pilots = ["a[kv=auto,skip=-,spec=-,attn=TRITON_ATTN]", "a[kv=fp8,skip=-,spec=-,attn=TRITON_ATTN]",
              "a[kv=auto,skip=-,spec=-,attn=-]", "a[kv=fp8,skip=-,spec=-,attn=-]", "b[kv=fp8_e5m2,skip=-,spec=-]",
              "c[kv=fp8,skip=0,spec=-]", "d[kv=auto,skip=-,spec=-]", "d[kv=fp8,skip=-,spec=-]"]
    # A forced backend's pilots first (the long JIT compiles), then vLLM's pick, one per model and KV-dtype mix.
    assert ids(ordered)[:8] == pilots
    assert sorted(ids(ordered)) == sorted(ids(tasks)), "every cell runs once"
    by_id = {t.cell.cell_id: t.key for t in tasks}
    assert all(not waits[by_id[p]] for p in pilots)
    # Each other cell waits for its own family's pilot: an fp8 cache for the fp8 pilot, a bf16 one for the bf16,
    # of its own model (another model's cells compile its own kernels: they have their own pilots).
    assert waits[by_id["b[kv=fp8,skip=-,spec=-]"]] == {by_id["a[kv=fp8,skip=-,spec=-,attn=-]"]}
    assert waits[by_id["b[kv=auto,skip=-,spec=-]"]] == {by_id["a[kv=auto,skip=-,spec=-,attn=-]"]}
    # A pilot's model reference waits for no pilot (b's bf16 cell, c's added one): the pilot waits for it.
    assert not waits[by_id["b[kv=bfloat16,skip=-,spec=-]"]] and not waits[by_id["c[kv=bfloat16,skip=-,spec=-]"]]
    warm = {f"{model}:{family}" for model in ("llama", "ct-llama") for family in (
        "default-bf16", "default-fp8", "TRITON_ATTN-bf16", "TRITON_ATTN-fp8", "default-fp8_e5m2", "default-fp8+bf16")}
    ordered, waits = pilot_gates(tasks, warm_families=warm)
    assert ids(ordered) == ids(tasks) and not any(waits.values()), "a warm machine runs no pilot"


def test_a_pilot_runs_here_and_is_expected_to_pass_and_a_timed_order_stays(cases_dir):
    tasks = tasks_of(cases_dir, "a", {"kv_cache_dtype": ["auto", "bfloat16", "fp8"]})
    first, second, third = (t.key for t in tasks)
    # The first auto cell is a skip or expected to fail: the next one of its family pilots, the order stays.
    ordered, waits = pilot_gates(tasks, warm_families=set(), can_pilot={second, third}, pilots_first=False)
    assert ordered == tasks
    assert waits == {first: {second}, second: set(), third: set()}


def test_a_slow_pilot_holds_back_its_family_only(cases_dir, tmp_path, monkeypatch):
    # A forced-backend family whose pilot compiles for a long time (here: sleeps), and vLLM's pick beside it.
    tasks = tasks_of(cases_dir, "slow", {"kv_cache_dtype": ["auto", "bfloat16"], "attention_backend": ["TRITON_ATTN"]})
    tasks += tasks_of(cases_dir, "ok", {"kv_cache_dtype": ["auto", "bfloat16", "fp8"]})
    monkeypatch.setenv("FAKE_CELL_SLEEP", "4")
    settings = RunSettings(run_dir=RunDir(tmp_path / "run"), models=load_models(cases_dir), built={"llama": cases_dir},
                           vllm_version="fake", cache_dir=tmp_path / "cache", cell_command=FAKE_CELL)
    finished: list[str] = []
    run_locally(tasks, settings, jobs=2, on_record=lambda r, *_: finished.append(r["cell_id"]))
    # The pilot leads after its model reference (slow's bf16 cell, vLLM's pick: it sleeps too, and pilots the
    # default bf16 family, so ok's auto cell waits for it). The other slot ran every other cell meanwhile and while
    # the pilot ran (no barrier after the pilots), and the pilot's family-mate started only after it.
    assert finished == ["ok[kv=bfloat16,skip=-,spec=-]", "ok[kv=fp8,skip=-,spec=-]",
                        "slow[kv=bfloat16,skip=-,spec=-,attn=-]", "ok[kv=auto,skip=-,spec=-]",
                        "slow[kv=auto,skip=-,spec=-,attn=TRITON_ATTN]",
                        "slow[kv=bfloat16,skip=-,spec=-,attn=TRITON_ATTN]"]


def test_a_pool_marks_the_families_it_warmed(cases_dir, tmp_path):
    tasks = tasks_of(cases_dir, "ok", {"kv_cache_dtype": ["auto", "fp8", "bfloat16"]})
    settings = RunSettings(run_dir=RunDir(tmp_path / "run"), models=load_models(cases_dir), built={"llama": cases_dir},
                           vllm_version="fake", cache_dir=tmp_path / "cache", cell_command=FAKE_CELL)
    assert warm_families(settings) == set()
    records = run_locally(tasks, settings, jobs=2)
    assert [r["verdict"] for r in records] == ["pass"] * 3
    # Marked by the backend the cells resolved: the fake cell's is prebuilt, so one family holds every KV dtype.
    assert {r["layers"][0]["backend"] for r in records} == {"FAKE"}
    assert warm_families(settings) == {"llama:FAKE"}


def test_the_kv_dtype_splits_a_family_only_where_the_backend_compiles_per_dtype(cases_dir):
    tasks = tasks_of(cases_dir, "a", {"kv_cache_dtype": ["auto", "fp8"], "kv_cache_dtype_skip_layers": [[], ["0"]]})
    by_id = {t.cell.cell_id: t for t in tasks}
    auto, fp8, mixed = (by_id[f"a[kv={kv},skip={skip},spec=-]"] for kv, skip in
                        (("auto", "-"), ("fp8", "-"), ("fp8", "0")))
    # No history: vLLM's pick is unknown, each KV-dtype mix is its own family.
    assert [kernel_family(t) for t in (auto, fp8, mixed)] == [
        "llama:default-bf16", "llama:default-fp8", "llama:default-fp8+bf16"]
    # The last run picked FlashAttention (prebuilt for every dtype): one family, whose pilot the others wait for
    # (two cold Nemotron-H cells on the H200 warmed the same Mamba kernels side by side).
    flash = {t.cell.cell_id: "FLASH_ATTN" for t in tasks}
    assert {kernel_family(t, "FLASH_ATTN") for t in (auto, fp8, mixed)} == {"llama:FLASH_ATTN"}
    _, waits = pilot_gates([auto, fp8, mixed], warm_families=set(), backends=flash)
    assert waits == {auto.key: set(), fp8.key: {auto.key}, mixed.key: {auto.key}}
    # FlashInfer builds its modules per dtype, also when only some layers use it: the families stay apart.
    infer = {auto.cell.cell_id: "FLASHINFER", fp8.cell.cell_id: "FLASHINFER",
             mixed.cell.cell_id: "FLASH_ATTN/FLASHINFER"}
    _, waits = pilot_gates([auto, fp8, mixed], warm_families=set(), backends=infer)
    assert not any(waits.values())
    assert kernel_family(mixed, infer[mixed.cell.cell_id]) == "llama:FLASH_ATTN/FLASHINFER-fp8+bf16"


def test_the_history_names_each_cells_backend_from_a_real_h200_run(tmp_path):
    """On the cold H200 run (vLLM 0.26.0), vLLM picked FlashAttention for both Nemotron-H cells: with that run as
    history, the pair is one family (one pilot). A cell that died before the probe resolved nothing, and keeps a
    family per KV dtype."""
    with tarfile.open(FIXTURES / "runs" / "h200-cold-warm-workers-vllm-0.26.0-2026-12-01.tar.xz") as archive:
        archive.extractall(tmp_path, filter="data")
    db = history.open_db(tmp_path / "h.sqlite")
    history.import_records(db, [json.loads(p.read_text()) for p in (tmp_path / "cold4-h200").glob("*--*.json")])
    backends = history.last_backends(db, "H200")
    assert backends["nemotron-h-hybrid[kv=auto,skip=-,spec=-]"] == "FLASH_ATTN"
    assert backends["nemotron-h-hybrid[kv=fp8,skip=-,spec=-]"] == "FLASH_ATTN"
    assert backends["flashinfer-qdtype[kv=fp8,skip=0,spec=-,attn=FLASHINFER]"] == "FLASHINFER"
    assert "fp8-every-backend[kv=fp8_e5m2,skip=-,spec=-,attn=-]" not in backends, "it crashed in the engine's start"
    assert history.last_backends(db, "L4") == {}

    pool, cells, _ = shipped_matrix()
    tasks = [Task(cell, "H200", pool["H200"]) for cell in cells.values() if cell.case.name in
             ("nemotron-h-hybrid", "fp8-every-backend", "flashinfer-qdtype")]
    families = {t.cell.cell_id: kernel_family(t, backends.get(t.cell.cell_id)) for t in tasks}
    assert families["nemotron-h-hybrid[kv=auto,skip=-,spec=-]"] == "nemotron-h:FLASH_ATTN"
    assert families["nemotron-h-hybrid[kv=fp8,skip=-,spec=-]"] == "nemotron-h:FLASH_ATTN"
    assert families["fp8-every-backend[kv=fp8_e5m2,skip=-,spec=-,attn=-]"] == "llama:default-fp8_e5m2"
    assert families["flashinfer-qdtype[kv=fp8,skip=0,spec=-,attn=FLASHINFER]"] == "llama:FLASHINFER-fp8+bf16"


def test_families_of_cells_with_several_backends_are_marked_beside_single_backend_ones(tmp_path):
    # As glm5-fp8 on the H200: one cell's layers on one backend, a skip-layer cell's on two ("A/B").
    settings = RunSettings(run_dir=RunDir(tmp_path / "run"), models={}, built={}, vllm_version="0.26.0",
                           cache_dir=tmp_path / "cache", cell_command=FAKE_CELL)
    families = {"glm5-fp8:FLASH_ATTN_MLA_SPARSE", "glm5-fp8:FLASH_ATTN_MLA_SPARSE/FLASHMLA_SPARSE",
                "llama:FLASHINFER-fp8+bf16"}
    for family in sorted(families):
        mark_warm(settings, family)
    assert warm_families(settings) == families
    assert len(list((tmp_path / "cache" / "pilots").iterdir())) == 3, "one file each, no folders"


def test_last_backends_are_each_cells_latest_resolved_one(tmp_path):
    db = history.open_db(tmp_path / "h.sqlite")

    def rec(cell, run, day, backend=None):
        layers = [{"name": "model.layers.0.self_attn.attn", "role": "target", "backend": backend}] if backend else []
        return {"cell_id": cell, "run_id": run, "gpu_class": "H200", "verdict": "pass", "layers": layers,
                "finished_at": f"2026-11-{day:02d}T02:00:00Z"}

    history.import_records(db, [rec("x", "night-1", 1, "FLASH_ATTN"), rec("y", "night-1", 1, "FLASHINFER")])
    history.import_records(db, [rec("x", "night-2", 2, "FLASHINFER"), rec("y", "night-2", 2)])  # y resolved nothing
    assert history.last_backends(db, "H200") == {"x": "FLASHINFER", "y": "FLASHINFER"}


def test_a_free_slot_passes_over_cells_that_would_wait_for_a_running_build(cases_dir, tmp_path, monkeypatch):
    """The two trained models share one training (one build of that family at a time): while the first one's
    cell builds it, the other slot runs cells of built models instead of waiting for the training in its slot."""
    tasks = tasks_of(cases_dir, "accuracy", {"kv_cache_dtype": ["auto"]}, model="trained-llama")
    tasks += tasks_of(cases_dir, "clipping", {"kv_cache_dtype": ["auto"]}, model="trained-llama-fp8kv-clipping")
    tasks += tasks_of(cases_dir, "ok", {"kv_cache_dtype": ["auto", "bfloat16", "fp8"]})
    settings = RunSettings(run_dir=RunDir(tmp_path / "run"), models=load_models(cases_dir), built={"llama": cases_dir},
                           vllm_version="fake", cache_dir=tmp_path / "cache", cell_command=FAKE_CELL)

    def training(name, entry, cache_dir):  # the real builders train for a minute or more
        time.sleep(4)
        return cases_dir

    monkeypatch.setattr(model_builds, "_build", training)
    finished: list[str] = []
    run_locally(tasks, settings, jobs=2, on_record=lambda r, *_: finished.append(r["cell_id"]))
    assert sorted(finished[:3]) == ["ok[kv=auto,skip=-,spec=-]", "ok[kv=bfloat16,skip=-,spec=-]",
                                    "ok[kv=fp8,skip=-,spec=-]"]
    assert finished[3:] == ["accuracy[kv=auto,skip=-,spec=-]", "clipping[kv=auto,skip=-,spec=-]"]


def test_the_training_starts_with_the_run_while_its_cells_come_last(cases_dir, tmp_path, monkeypatch):
    """The trained models train in a thread of their own from the run's start: their cells, last in the order,
    find them built instead of starting the training in their slot once they come up."""
    tasks = tasks_of(cases_dir, "ok", {"kv_cache_dtype": ["auto", "bfloat16", "fp8"]})
    tasks += tasks_of(cases_dir, "accuracy", {"kv_cache_dtype": ["auto"]}, model="trained-llama")
    settings = RunSettings(run_dir=RunDir(tmp_path / "run"), models=load_models(cases_dir), built={"llama": cases_dir},
                           vllm_version="fake", cache_dir=tmp_path / "cache", cell_command=FAKE_CELL)
    events: list[str] = []

    def training(name, entry, cache_dir):
        events.append(f"training {name}")
        time.sleep(2)
        return cases_dir

    monkeypatch.setattr(model_builds, "_build", training)
    run_locally(tasks, settings, jobs=1, on_record=lambda r, *_: events.append(r["cell_id"]))
    assert events[0] == "training trained-llama"
    assert events[-1] == "accuracy[kv=auto,skip=-,spec=-]"
