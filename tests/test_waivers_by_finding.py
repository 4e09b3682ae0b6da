"""Waivers by finding (harness/vllm_compat/findings.py, `finding=` in cases/_waivers.txt): a known finding is waived
wherever it shows (its signature in the configuration that triggers it), in every case and class, within the
waiver's releases, and only there; the run says where a waiver held beyond the cells it was written for.

On vLLM 0.34.0's default matrix, judged again under the shipped case files: the H200's run
(tests/fixtures/runs/h200-vllm-0.34.0-2026-12-04.tar.xz) and the H100's warm run
(tests/fixtures/runs/h100-vllm-0.34.0-2026-12-05.tar.xz), which failed exactly these under the waivers of then:
FULL graphs in execution-modes and trained-llama-execution, the draft-fp8 FA3 crash in spec-draft-kv. The
spec-draft-kv draft-fp8 cell did not run on the H200 before its time ran out: its record there is the FA3 crash of
spec-draft-backends' cell of the same configuration (bf16 target, the draft's own KV fp8, the default draft
backend), moved onto it."""

from __future__ import annotations

import copy
import json

import pytest

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.waivers import parse_waivers, waiver_problems
from kvmatrix.harness.record.files import RunDir
from kvmatrix.harness.record.neighbours import neighbours_of
from kvmatrix.harness.record.task import Task
from kvmatrix.harness.run.rejudge import rejudge_run
from kvmatrix.reports import markdown
from tests.conftest import FIXTURES, shipped_matrix, unpacked_archive

H200_MATRIX = FIXTURES / "runs" / "h200-vllm-0.34.0-2026-12-04.tar.xz"
H100_MATRIX = FIXTURES / "runs" / "h100-vllm-0.34.0-2026-12-05.tar.xz"
FULL_GRAPHS = ("execution-modes[kv=auto,skip=-,spec=-,exec=graphs_full,wl=plain]",
               "execution-modes[kv=fp8,skip=-,spec=-,exec=graphs_full,wl=plain]",
               "trained-llama-execution[kv=auto,skip=-,spec=-,exec=graphs_full]")
DRAFT_FP8_ON_FA3 = ("spec-draft-backends[kv=auto,skip=-,spec=llama-dflash,dkv=fp8,dattn=-,exec=eager]",
                    "spec-draft-backends[kv=auto,skip=-,spec=llama-eagle3-flat,dkv=fp8,dattn=-,exec=eager]")
DRAFT_KV = "spec-draft-kv[kv=auto,skip=-,spec=trained-llama-draft,dkv=fp8,exec=eager]"
# What each class's run holds of them: the H100's warm run ran every cell (the fp8 trained Llama's FULL graphs and
# the draft-fp8 cell's graphs twin too), the H200's stopped before.
FULL_GRAPHS_RUN = {"H200": FULL_GRAPHS,
                   "H100": (*FULL_GRAPHS, "trained-llama-execution[kv=fp8,skip=-,spec=-,exec=graphs_full]")}
DRAFT_KV_RUN = {"H200": (DRAFT_KV,), "H100": (DRAFT_KV, DRAFT_KV.replace(",exec=eager", ""))}


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """class -> cell id -> the 0.34.0 run's record judged again under the shipped cases; on the H200 the
    spec-draft-kv draft-fp8 cell given its configuration's FA3 crash."""
    pool, cells, waivers = shipped_matrix()
    h200 = RunDir(unpacked_archive(tmp_path_factory, H200_MATRIX) / "cold")
    crash = h200.read(DRAFT_FP8_ON_FA3[0], "H200")
    assert crash is not None and h200.read(DRAFT_KV, "H200") is None
    cell = cells[DRAFT_KV]
    h200.write({**copy.deepcopy(crash), "cell_id": DRAFT_KV, "case": cell.case.name, "model": cell.model,
                "axes": cell.axes})
    h100 = RunDir(unpacked_archive(tmp_path_factory, H100_MATRIX) / "warm")
    out = {}
    for gpu, run_dir in (("H200", h200), ("H100", h100)):
        out[gpu] = {r["cell_id"]: r for r in rejudge_run(run_dir, cells, pool, waivers)}
        assert {r["gpu_class"] for r in out[gpu].values()} == {gpu}
        assert {r.get("emulated_from") for r in out[gpu].values()} == {None}
    return out


@pytest.mark.parametrize("gpu", ["H200", "H100"])
def test_full_graphs_and_the_draft_fp8_crash_are_waived_by_their_finding_wherever_they_show(judged, gpu):
    for cell_id in FULL_GRAPHS_RUN[gpu]:
        record = judged[gpu][cell_id]
        assert record["verdict"] == "xfail", (gpu, cell_id, record["reason"])
        assert record["waived"]["finding"] == "full-cudagraph-decode-diverges"
        assert record["reason"].startswith("waived (FULL CUDA graph decode diverges from eager at differential, ")
    for cell_id in (*DRAFT_FP8_ON_FA3, *DRAFT_KV_RUN[gpu]):
        record = judged[gpu][cell_id]
        assert record["verdict"] == "xfail", (gpu, cell_id, record["reason"])
        assert record["signature"] == "fa3_scheduler_metadata_dtype" and "3b362570" not in record["reason"]
        assert record["waived"]["finding"] == "fa3-scheduler-metadata-dtype"
        assert record["reason"].startswith("waived (FA3 scheduler-metadata dtype at "
                                           "vllm.vllm_flash_attn.flash_attn_interface:get_scheduler_metadata, ")
    assert not [(c, r["reason"]) for c, r in judged[gpu].items() if r["verdict"] == "fail"
                and not c.startswith("glm-fp8[kv=bfloat16")]  # the MTP numerics: test_gpu_records_0_34.py


def test_the_run_names_every_cell_a_finding_waived_beyond_the_cells_it_was_written_for(judged):
    _, _, waivers = shipped_matrix()
    problems = {gpu: [p for p in waiver_problems(records.values(), waivers) if p.kind == "beyond"]
                for gpu, records in judged.items()}
    assert not any(p.is_error for found in problems.values() for p in found)  # said, not an error
    beyond = {gpu: sorted(p.detail for p in found) for gpu, found in problems.items()}
    assert beyond["H200"] == [f"finding fa3-scheduler-metadata-dtype waived {DRAFT_KV} @H200, beyond "
                              "spec-draft-backends[kv=auto,skip=-,spec=*,dkv=fp8,dattn=-*] gpu=H100,H200"]
    assert len(beyond["H100"]) == 6
    assert {d.split(" waived ")[1].split(" @")[0] for d in beyond["H100"]} == {*FULL_GRAPHS_RUN["H100"],
                                                                                *DRAFT_KV_RUN["H100"]}
    for gpu, records in judged.items():
        for cell_id, record in records.items():
            assert bool((record.get("waived") or {}).get("beyond")) == any(
                f" {cell_id} @{gpu}," in d for d in beyond[gpu])
    shown = markdown.render(list(judged["H100"].values()), "H100")
    section = shown.split("## Waived by finding beyond the cells the waiver was written for")[1].split("\n## ")[0]
    assert sorted(line.split("`")[1] for line in section.splitlines() if line.startswith("- ")) == sorted(
        {*FULL_GRAPHS_RUN["H100"], *DRAFT_KV_RUN["H100"]})


def test_a_findings_waiver_holds_only_where_its_finding_shows(judged, tmp_path):
    """Outside its configuration (the same FA3 crash under an fp8 target), its releases (0.35.0), or on a cell
    it was written for that fails otherwise, the finding's waiver waives nothing."""
    pool, cells, waivers = shipped_matrix()
    record = judged["H100"][DRAFT_FP8_ON_FA3[0]]
    fp8_target = "spec-draft-backends[kv=fp8,skip=-,spec=llama-dflash,dkv=-,dattn=-,exec=eager]"
    other_config = {**record, "cell_id": fp8_target, "axes": cells[fp8_target].axes}
    later = {**record, "vllm_version": "0.35.0"}
    other_failure = {**record, "signature": "no_common_block_size", "error_tail": "ValueError: No common block size"}
    run_dir = RunDir(tmp_path / "run")
    for outcome in (other_config, later, other_failure):
        task = Task(cells[outcome["cell_id"]], "H100", pool["H100"])
        judged_again = judge_record(outcome, task, neighbours_of(task, run_dir), waivers)
        assert judged_again["verdict"] == "fail" and "waived" not in judged_again, judged_again["reason"]


def test_a_finding_no_table_knows_is_a_mistake_naming_the_line():
    with pytest.raises(ValueError, match=r"w.txt:1: finding=fa3-typo is no known finding \(fa3-scheduler"):
        parse_waivers("c[*]  finding=fa3-typo  https://example.org/1\n", "w.txt")
    (waiver,) = parse_waivers("c[*]  finding=fa3-scheduler-metadata-dtype  https://example.org/1\n", "w.txt")
    assert waiver.finding == "fa3-scheduler-metadata-dtype" and json.dumps(waiver.pattern) == '"c[*]"'
