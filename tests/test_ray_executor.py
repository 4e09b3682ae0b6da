"""The Ray pool on a local multi-node cluster (Ray's own `cluster_utils`: several raylets on this machine):
cells of two emulated GPU classes go to nodes declaring their class as a custom resource, one node is killed
while it runs a cell, and every cell ends accounted for: run again elsewhere and recorded in the run folder
exactly as a local run records it, or reported (a class with no node) and left for a rerun."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kvmatrix.harness import cli
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run import plan as run_plan
from kvmatrix.harness.run.order.policy import PastRuns
from kvmatrix.harness.run.order.start_order import planned_order
from kvmatrix.harness.run.settings import RunSettings
from kvmatrix.matrix.expand import expand_all
from kvmatrix.matrix.load import load_cases, load_models, load_pool
from tests.conftest import write_case
from tests.test_faults import alive

ray = pytest.importorskip("ray", reason="ray is not importable: the Ray pool is optional (pip install ray)",
                         exc_type=ImportError)
from ray.cluster_utils import Cluster  # noqa: E402

from kvmatrix.harness.run.executor.ray import placement, run_tasks_on_ray  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FAKE_CELL = REPO / "tests" / "fake_cell.py"
# The fake cell, noting each start (its process id) in a marker file named by the task (the spec file's name less
# the harness process id the runner adds), so the test sees where and when cells ran, whichever worker ran them.
MARKED_CELL = ("sh", "-c", 'b=$(basename "$2" .spec.json); echo $$ >> "$KVM_MARKERS/${b%.*}"; exec "$0" "$@"',
               sys.executable, str(FAKE_CELL))


def start_cluster(monkeypatch, head: dict[str, float], nodes: dict[str, dict[str, float]]) -> tuple[Cluster, dict]:
    """A local multi-node cluster: the head and each named node declaring these custom resources."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the nodes' workers import harness/
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 << 20,
                                                            "resources": head})
    added = {name: cluster.add_node(num_cpus=1, object_store_memory=80 << 20, resources=resources)
             for name, resources in nodes.items()}
    cluster.wait_for_nodes()
    return cluster, added


@pytest.fixture
def cluster(monkeypatch):
    # The head (where the driver runs) is the A100 node; the two L4 nodes have one slot each.
    cluster, nodes = start_cluster(monkeypatch, {"gpu_class:A100": 2},
                                   {name: {"gpu_class:L4": 1} for name in ("L4-a", "L4-b")})
    ray.init(address=cluster.address)
    yield cluster, nodes
    ray.shutdown()
    cluster.shutdown()


def test_cells_survive_a_node_killed_mid_run(cluster, cases_dir, tmp_path):
    cluster, nodes = cluster
    write_case(cases_dir, "slow", {"model": "llama", "gpus": ["L4", "A100"], "timeout_s": 120,
                                   "matrix": {"kv_cache_dtype": ["auto", "bfloat16", "fp8"]}})
    write_case(cases_dir, "ok", {"model": "llama", "gpus": ["L4", "H100"], "timeout_s": 60,
                                 "matrix": {"kv_cache_dtype": ["auto", "fp8"]}})  # no node is an H100
    pool, models = load_pool(cases_dir), load_models(cases_dir)
    cells = expand_all(load_cases(sorted(cases_dir.glob("[!_]*.yaml"))), models, pool)
    tasks = [Task(c, gpu, pool[gpu]) for c in cells for gpu in c.gpu_classes]
    markers = tmp_path / "markers"
    markers.mkdir()
    run_dir = RunDir(tmp_path / "run")
    settings = RunSettings(run_dir=run_dir, models=models, built={"llama": cases_dir}, vllm_version="fake",
                           cache_dir=tmp_path / "cache", cell_command=MARKED_CELL,
                           # Long enough that the two L4 nodes' first cells overlap, even on a loaded CI machine
                           # where a node's first worker starts seconds after the other's.
                           env={"FAKE_CELL_SLEEP": "6", "KVM_MARKERS": str(markers)})

    def l4_slow_running() -> int:
        """The slow L4 cells running now (each marker line is a start's pid): each L4 node has one slot, so two at
        once are one on each node. Two started are not: on a loaded machine one node may run two in turn while the
        other's first worker is still starting."""
        pids = [int(pid) for marker in markers.glob("L4--slow*") for pid in marker.read_text().split()]
        return sum(alive(pid) for pid in pids)

    killed = []

    def kill_l4_node_mid_cell():
        deadline = time.monotonic() + 90
        while l4_slow_running() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.remove_node(nodes["L4-a"], allow_graceful=False)
        killed.append(time.monotonic())

    thread = threading.Thread(target=kill_l4_node_mid_cell)
    thread.start()
    started = time.monotonic()
    order = planned_order(tasks, settings, 1, 0, PastRuns(), [])  # as a Ray run's plan orders them
    records = run_tasks_on_ray(tasks, order, settings, unplaceable_after_s=3)
    thread.join()
    assert killed, "the node was never killed"

    by_key = {(r["cell_id"], r["gpu_class"]): r for r in records}
    assert set(by_key) == {(t.cell.cell_id, t.gpu_name) for t in tasks}  # every cell accounted for
    for (cell_id, gpu), record in by_key.items():
        if gpu == "H100":
            assert record["verdict"] == "error" and "no live node with resource gpu_class:H100" in record["reason"]
            assert run_dir.read(cell_id, gpu) is None  # reported, left for a rerun
        else:
            assert record["verdict"] == "pass", (cell_id, gpu, record["reason"])
            assert run_dir.read(cell_id, gpu) == record  # written as a local run writes it
            assert (run_dir.root / record["log"]).read_text().startswith(f"fake cell {cell_id}")
    starts = {p.name: len(p.read_text().split()) for p in markers.iterdir()}
    assert max(starts[k] for k in starts if k.startswith("L4--slow")) == 2  # the killed node's cell ran again
    assert all(n == 1 for k, n in starts.items() if not k.startswith("L4--slow"))

    # Resume: finished cells are not sent again; only the unobserved ones are reported again.
    again = run_tasks_on_ray(tasks, order, settings, unplaceable_after_s=0)
    assert [r["cell_id"] for r in again] == [r["cell_id"] for r in records]
    assert sum(len(p.read_text().split()) for p in markers.iterdir()) == sum(starts.values())
    assert time.monotonic() - started < 180


def test_placement_by_class_resource_or_accelerator_type(cases_dir):
    write_case(cases_dir, "c", {"model": "llama", "gpus": ["L4"]})
    pool = load_pool(cases_dir)
    cell, _eager_twin = expand_all(load_cases([cases_dir / "c.yaml"]), load_models(cases_dir), pool)
    emulated = Task(cell, "L4", pool["L4"], emulated_from="H200")  # runs on an H200, decides as an L4
    assert placement(emulated) == ("gpu_class:H200", {"num_cpus": 0, "resources": {"gpu_class:H200": 1}})
    assert placement(emulated, real_gpus=True, gpu_classes=pool) == (
        "accelerator_type:H200", {"num_cpus": 0, "num_gpus": 1 / pool["H200"].slots_per_device,
                                  "accelerator_type": "H200"})  # a share of the GPU per slot
    assert placement(Task(cell, "L4", pool["L4"]), real_gpus=True, accelerator_types={"L4": "NVIDIA_L4"})[0] == (
        "accelerator_type:NVIDIA_L4")


@pytest.fixture
def cpu_cluster(monkeypatch):
    """Two nodes of the `cpu-avx512` class, not joined by this process: `kvmatrix run --ray` joins it itself (the
    cells are fake: the class is a label, whatever this machine's CPU is)."""
    cluster, _ = start_cluster(monkeypatch, {}, {name: {"gpu_class:cpu-avx512": 1} for name in ("cpu-a", "cpu-b")})
    yield cluster
    cluster.shutdown()


def test_cli_runs_cells_on_a_ray_cluster_and_resumes(cpu_cluster, cases_dir, tmp_path, monkeypatch, capsys):
    write_case(cases_dir, "ok", {"model": "llama", "gpus": ["cpu-avx512"],
                                 "matrix": {"kv_cache_dtype": ["auto", "fp8"]}})
    markers = tmp_path / "markers"
    markers.mkdir()
    real_open_session = run_plan.open_session

    def fake_cell_session(*args, **kwargs):  # the CLI's session, with fake cells and no model build
        session = real_open_session(*args, **kwargs)
        session.settings = replace(session.settings, cell_command=MARKED_CELL, env={"KVM_MARKERS": str(markers)})
        session.build_models = lambda tasks: session.settings.built.update(llama=cases_dir)
        return session

    monkeypatch.setattr(run_plan, "open_session", fake_cell_session)
    argv = ["run", "--cases-dir", str(cases_dir), "--runs-dir", str(tmp_path / "runs"), "--run-id", "ray",
            "--cache-dir", str(tmp_path / "cache"), "--db", str(tmp_path / "none.sqlite"), "--gpu", "cpu-avx512",
            "--ray", cpu_cluster.address]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    run_dir = RunDir(tmp_path / "runs" / "ray")
    records = {r["cell_id"]: r for r in run_dir.records()}
    assert sorted(records) == ["ok[kv=auto,skip=-,spec=-]", "ok[kv=fp8,skip=-,spec=-]"]
    assert all(r["verdict"] == "pass" and (run_dir.root / r["log"]).exists() for r in records.values())
    assert out.count("PASS  ok[") == 2 and "on the Ray cluster at" in out
    assert (run_dir.root / "matrix.md").exists() and (run_dir.root / "junit.xml").exists()
    assert len(list(markers.iterdir())) == 2

    assert cli.main(argv) == 0  # the same run id: resumed, nothing sent to the cluster again
    assert capsys.readouterr().out.count("(resumed)") == 2
    assert sum(len(p.read_text().split()) for p in markers.iterdir()) == 2


def test_the_canary_stops_a_run_on_a_ray_cluster_too(cpu_cluster, cases_dir, tmp_path, monkeypatch, capsys):
    """The plan's canary holds on the cluster as on this machine's slots: the plainest cell runs alone first, and
    when it crashes the run stops with one line, exit 2, nothing recorded and nothing else sent."""
    # fake cells behave by case name: "crash" raises, "ok" runs (tests/fake_cell.py)
    write_case(cases_dir, "crash", {"model": "llama", "gpus": ["cpu-avx512"],
                                    "matrix": {"kv_cache_dtype": ["auto", "bfloat16"]}})
    write_case(cases_dir, "ok", {"model": "llama", "gpus": ["cpu-avx512"], "matrix": {"kv_cache_dtype": ["auto"]}})
    markers = tmp_path / "markers"
    markers.mkdir()
    real_open_session = run_plan.open_session

    def fake_cell_session(*args, **kwargs):
        session = real_open_session(*args, **kwargs)
        session.settings = replace(session.settings, cell_command=MARKED_CELL, env={"KVM_MARKERS": str(markers)})
        return session

    monkeypatch.setattr(run_plan, "open_session", fake_cell_session)
    argv = ["run", "--cases-dir", str(cases_dir), "--runs-dir", str(tmp_path / "runs"), "--run-id", "ray",
            "--cache-dir", str(tmp_path / "cache"), "--db", str(tmp_path / "none.sqlite"), "--gpu", "cpu-avx512",
            "--ray", cpu_cluster.address]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "kvmatrix: environment broken: the canary cell crash[kv=auto,skip=-,spec=-] on cpu-avx512")
    assert list(RunDir(tmp_path / "runs" / "ray").records()) == []
    assert [p.name for p in markers.iterdir()] == ["cpu-avx512--crash[kv=auto,skip=-,spec=-]"]  # the only cell sent
