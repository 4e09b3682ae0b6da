"""The start order and the slots of a run (harness/run/executor/local.py, harness/run/host/slots.py,
harness/run/last_run.py): the long JIT pilots first, each cell after what it waits for, cells of a case's own
environment kept in the slot that has their worker, cells started beside the canary, the last run's timings kept with
the caches, and the H200's eight slots. Pure logic over the shipped matrix, or fake cells that speak the real protocol
(tests/fake_cell.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.executor.local import run_locally
from kvmatrix.harness.run.host.slots import slot_count
from kvmatrix.harness.run.last_run import last_run_file, recall, remember
from kvmatrix.harness.run.order.longest_first import order_tasks
from kvmatrix.harness.run.order.policy import PastRuns, StartContext
from kvmatrix.harness.run.order.prerequisites import prerequisites_first
from kvmatrix.harness.run.order.start_order import start_order
from kvmatrix.harness.run.session import Session
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.harness.run.task.runner import expected_not_to_pass
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import load_cases, load_models, load_pool
from tests.conftest import shipped_matrix, write_case

FAKE_CELL = (sys.executable, str(Path(__file__).with_name("fake_cell.py")))
FAKE_WORKER = (sys.executable, str(Path(__file__).with_name("fake_worker.py")))
CPU = "cpu-avx512"  # any class: the cells here run a fake cell process


def shipped_h200(tmp_path: Path) -> tuple[list[Task], RunSettings, dict]:
    pool, cells, waivers = shipped_matrix()
    settings = RunSettings(run_dir=RunDir(tmp_path / "run"), models=load_models(), built={}, vllm_version="0.33.0",
                           cache_dir=tmp_path / "cache", isolation="worker", waivers=waivers, gpus_here=1)
    tasks = [Task(c, "H200", pool["H200"]) for c in cells.values() if "H200" in c.gpu_classes]
    expected = {t.key: expected_not_to_pass(t, settings, None) for t in tasks}
    return tasks, settings, expected


def test_a_cold_h200_run_starts_the_flashinfer_pilots_and_every_cell_after_what_it_waits_for(tmp_path):
    """No history, empty caches: the pilots of the forced JIT backends lead (FlashInfer's nvcc builds, the cold
    run's critical path); then each cell comes after every cell it waits for, so the eager oracle of a confirmation
    that starts early (fp8_e5m2 with vLLM's own pick, FlashInfer on the H200: 180 s of builds) starts early too."""
    tasks, settings, expected = shipped_h200(tmp_path)
    planned = start_order(order_tasks(tasks, {}), StartContext(settings, expected, slots=8))
    order, waits = list(planned.tasks), planned.waits
    ids = [t.cell.cell_id for t in order]
    assert sorted(ids) == sorted(t.cell.cell_id for t in tasks)
    assert ids[:2] == ["flashinfer-qdtype[kv=fp8,skip=-,spec=-,attn=FLASHINFER,exec=eager]",
                       "flashinfer-qdtype[kv=fp8,skip=0,spec=-,attn=FLASHINFER,exec=eager]"]
    position = {t.key: i for i, t in enumerate(order)}
    assert all(position[w] < position[t.key] for t in order for w in waits[t.key])
    assert ids.index("fp8-every-backend[kv=fp8_e5m2,skip=-,spec=-,attn=-,exec=eager]") < 16


def test_a_timed_run_keeps_its_longest_first_order(tmp_path):
    """With the last run's timings (a history, or the cache folder's), the order is theirs: no pilot leads."""
    tasks, settings, _ = shipped_h200(tmp_path)
    expected = dict.fromkeys((t.key for t in tasks), None)  # no expected failure: no confirmation goes first
    costs = {t.cell.cell_id: 5.0 for t in tasks} | {"glm5-fp8[kv=auto,skip=-,spec=-,exec=eager]": 400.0}
    planned = start_order(order_tasks(tasks, costs), StartContext(settings, expected, slots=8, past=PastRuns(costs)))
    order, waits = list(planned.tasks), planned.waits
    compared = [t for t in order if t.cell.baseline_id != t.cell.cell_id]  # after the accuracy baselines' wave
    assert compared[0].cell.cell_id == "glm5-fp8[kv=auto,skip=-,spec=-,exec=eager]"
    position = {t.key: i for i, t in enumerate(order)}
    assert all(position[w] < position[t.key] for t in order for w in waits[t.key])


def test_prerequisites_come_right_before_the_first_cell_that_waits_for_them(cases_dir):
    path = write_case(cases_dir, "a", {"model": "llama", "gpus": [CPU], "matrix": {"kv_cache_dtype":
                                                                                    ["auto", "bfloat16", "fp8"]}})
    pool = load_pool(cases_dir)
    first, second, third = [Task(c, CPU, pool[CPU]) for c in expand_all(load_cases([path]), load_models(cases_dir),
                                                                        pool)]
    waits = {first.key: {third.key}, second.key: set(), third.key: {second.key}}
    assert prerequisites_first([first, second, third], waits) == [second, third, first]
    assert prerequisites_first([second, first, third], waits) == [second, third, first]
    assert prerequisites_first([first, second, third], {k: set() for k in waits}) == [first, second, third]


def test_a_case_environments_cells_share_one_worker_while_other_cells_fill_the_other_slot(cases_dir, tmp_path,
                                                                                           monkeypatch):
    """Two slots: the three cells of a case with its own `env:` run one after another in one worker while the
    default cells fill the other slot (on a cold H200 each slot had started its own glm5-fp8 worker: imports and a
    first engine each). Without the rule the second and third would each take whichever slot came free first."""
    monkeypatch.setenv("FAKE_CELL_SLEEP", "1")
    # 16-bit caches only, the default cells of another model: each model one kernel family, whose first cell (its
    # pilot) the others wait for.
    sixteen_bit = {"kv_cache_dtype": ["auto", "bfloat16", "float16"]}
    write_case(cases_dir, "0-slow", {"model": "llama", "gpus": [CPU], "env": {"VLLM_USE_DEEP_GEMM": "0"},
                                     "matrix": sixteen_bit})
    for name in ("1-slow", "2-slow"):
        write_case(cases_dir, name, {"model": "ct-llama", "gpus": [CPU], "matrix": sixteen_bit})
    pool, models = load_pool(cases_dir), load_models(cases_dir)
    settings = RunSettings(run_dir=RunDir(tmp_path / "run"), models=models,
                           built={"llama": cases_dir, "ct-llama": cases_dir},
                           vllm_version="fake", cache_dir=tmp_path / "cache", cell_command=FAKE_CELL,
                           isolation="worker", worker_command=FAKE_WORKER)
    cells = expand_all(load_cases(sorted(cases_dir.glob("[!_]*.yaml"))), models, pool)
    records = run_locally(Session(settings, CPU, pool[CPU], None, pool).tasks(cells), settings, jobs=2)
    env_workers = {r["worker"]["pid"] for r in records if r["case"] == "0-slow"}
    assert len(env_workers) == 1, "; ".join(f'{r["cell_id"]} {r["worker"]["pid"]}/{r["worker"]["cells_before"]}'
                                            for r in records)
    assert all(r["verdict"] == "pass" for r in records)


def test_cells_run_beside_the_canary(cases_dir, tmp_path, monkeypatch):
    """The canary cell here passes only if a cell beside it runs meanwhile (tests/fake_cell.py `awaits`): with
    the canary alone first, it would crash and stop the run."""
    from dataclasses import replace

    from kvmatrix.harness import cli
    from kvmatrix.harness.run import plan as run_plan
    from tests.conftest import CPU_CLASS

    monkeypatch.setenv("FAKE_CELL_FLAG", str(tmp_path / "flag"))
    write_case(cases_dir, "0-awaits", {"model": "llama", "gpus": [CPU_CLASS], "matrix": {"kv_cache_dtype": ["auto"]}})
    # Another model: a cell of the canary's own kernel family would wait for it on a cold machine (its pilot).
    write_case(cases_dir, "1-flags", {"model": "ct-llama", "gpus": [CPU_CLASS],
                                      "matrix": {"kv_cache_dtype": ["bfloat16"]}})
    opened = run_plan.open_session

    def fake(*args, **kwargs):
        session = opened(*args, **kwargs)
        session.settings = replace(session.settings, cell_command=FAKE_CELL, worker_command=FAKE_WORKER)
        session.build_models = lambda tasks: session.settings.built.update({"llama": cases_dir, "ct-llama": cases_dir})
        return session

    monkeypatch.setattr(run_plan, "open_session", fake)
    args = ["run", "--cases-dir", str(cases_dir), "--runs-dir", str(tmp_path / "runs"), "--run-id", "beside",
            "--cache-dir", str(tmp_path / "cache"), "--db", str(tmp_path / "none.sqlite"), "--gpu", CPU_CLASS,
            "--jobs", "2", "--no-template"]
    assert cli.main(args) == 0
    verdicts = {r["cell_id"]: r["verdict"] for r in RunDir(tmp_path / "runs" / "beside").records()}
    assert verdicts == {"0-awaits[kv=auto,skip=-,spec=-]": "pass", "1-flags[kv=bfloat16,skip=-,spec=-]": "pass"}


def test_the_last_runs_timings_are_kept_with_the_caches(tmp_path):
    path = last_run_file(tmp_path, "H200", "0.33.0")
    assert recall(path) == ({}, {}, {})
    layers = [{"name": "model.layers.0.self_attn.attn", "backend": "FLASHINFER", "kv_cache_dtype": "fp8"}]
    remember(path, {"cell_id": "a", "verdict": "pass", "timings": {"total_s": 12.5}, "layers": layers})
    remember(path, {"cell_id": "b", "verdict": "xfail", "timings": {"total_s": 3.0}, "layers": []})
    remember(path, {"cell_id": "c", "verdict": "skip", "reason": "hub"})  # never timed: not kept
    remember(path, {"cell_id": "a", "verdict": "fail", "timings": {"total_s": 20.0}, "layers": layers})
    assert recall(path) == ({"a": 20.0, "b": 3.0}, {"a": "fail", "b": "xfail"}, {"a": "FLASHINFER"})
    path.write_text("not json")
    assert recall(path) == ({}, {}, {})  # a damaged file costs the order, never the run


def test_the_h200_packs_eleven_cells_within_its_memory_and_cores():
    h200 = load_pool()["H200"]
    assert slot_count(h200, devices=1, cores=16, device_memory_gib=139.8) == 11
    assert slot_count(h200, devices=2, cores=32, device_memory_gib=139.8) == 22
    assert slot_count(h200, devices=1, cores=8, device_memory_gib=139.8) == 5, "1.45 cores a slot"
    h100 = load_pool()["H100"]
    assert slot_count(h100, devices=1, cores=16, device_memory_gib=79.6) == 9, "8 GiB a slot"


def test_an_expected_accuracy_drop_starts_in_a_fresh_process_once_per_case(tmp_path):
    """The clipping checkpoint's `auto` cells are expected to lose accuracy (an xfail): the first of them, the eager
    oracle of the compiled one, starts in a fresh process instead of running in a worker and then again fresh (on
    the H200 with vLLM 0.33.0 that oracle ran twice); its sibling waits for it and stays warm (harness/run/
    confirmations.py)."""
    tasks, settings, expected = shipped_h200(tmp_path)
    by_id = {t.cell.cell_id: t for t in tasks}
    oracle = by_id["trained-llama-fp8kv-clipping[kv=auto,skip=-,spec=-,exec=eager]"]
    compiled = by_id["trained-llama-fp8kv-clipping[kv=auto,skip=-,spec=-]"]
    reason = expected[oracle.key]
    assert reason is not None and reason.startswith("the case expects an accuracy drop (the checkpoint's k/v")
    assert expected[compiled.key] == reason
    assert expected[by_id["trained-llama-fp8kv-clipping[kv=bfloat16,skip=-,spec=-]"].key] is None
    waits = start_order(order_tasks(tasks, {}), StartContext(settings, expected, slots=8)).waits
    assert oracle.key in waits[compiled.key]
