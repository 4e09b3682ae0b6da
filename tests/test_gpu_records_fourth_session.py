"""vLLM 0.33.0 (torch 2.14.0+cu130) on the lent H200, 2026-12-03, fourth device session: the emulated A100 finished
(the third session's folder resumed: its last 57 cells, 6 slots, 444 s) and the last cases of L4 and B200 run in
folders of their own (`-tail`: as far as the device time went, 18 of 20 and 13 of 56 cells), judged again under
the shipped case files.

The archive (tests/fixtures/runs/h200-graphs-vllm-0.33.0-2026-12-03-fourth.tar.xz) holds the three folders as the
device wrote them and each run's log (`logs/emu-*.log`, with the "host CPU" line of the A100 run).
reports/examples/h200-vllm0.33.0-graphs-all-classes-2026-12-03.md is their report, with the third session's."""

from __future__ import annotations

from collections import Counter

from kvmatrix.harness.audit import rejudged, render
from kvmatrix.harness.record.files import RunDir
from tests.conftest import CASES_DIR, FIXTURES, judged_archive_fixtures

ARCHIVE = FIXTURES / "runs" / "h200-graphs-vllm-0.33.0-2026-12-03-fourth.tar.xz"
RUNS = {"A100": "kvruns/h200-as-A100-vllm0.33.0-graphs", "L4": "kvruns/h200-as-L4-vllm0.33.0-graphs-tail",
        "B200": "kvruns/h200-as-B200-vllm0.33.0-graphs-tail"}

unpacked, judged = judged_archive_fixtures(ARCHIVE, RUNS, "0.33.0")


def test_the_emulated_a100s_whole_matrix_has_no_unexplained_failure(judged):
    """All 230 A100 cells of the default matrix on 0.33.0: the expected failures are the two waived findings and
    the clipping checkpoint's expected accuracy drop; the skips are the hub models and the two-GPU cells."""
    assert Counter(r["verdict"] for r in judged["A100"].values()) == {"pass": 186, "xfail": 20, "skip": 24}
    waived = Counter(r["waived"]["link"].split("#")[1] for r in judged["A100"].values() if r.get("waived"))
    assert waived == {"mla-ignores-checkpoint-kv-cache-scheme": 12, "eagle3-gpu-runner-ignores-nested-aux-layer-ids": 6}


def test_the_tails_of_l4_and_b200_pass_or_skip(judged):
    assert Counter(r["verdict"] for r in judged["L4"].values()) == {"pass": 10, "skip": 8}
    assert Counter(r["verdict"] for r in judged["B200"].values()) == {"pass": 9, "skip": 4}


def test_accuracy_cells_ran_lm_eval_on_every_emulated_class(judged):
    """lm-eval 0.4.13 carried to the device: the tiny task's 200 samples on each class, and on the A100 the
    clipping fp8 checkpoint's drop against its bf16 baseline (0.49 against 0.98)."""
    for gpu, records in judged.items():
        ran = [r for r in records.values() if r["cell_id"].startswith("trained-llama-") and r["verdict"] != "skip"]
        assert ran and all(r["accuracy"]["n"] == 200 for r in ran), gpu
    clipping = judged["A100"]["trained-llama-fp8kv-clipping[kv=auto,skip=-,spec=-]"]
    assert clipping["verdict"] == "xfail" and "expected accuracy drop" in clipping["reason"]
    paired = clipping["accuracy_vs_baseline"]
    assert paired["significant"] and (paired["baseline_score"], paired["score"]) == (0.98, 0.49)


def test_the_audit_names_the_vllm_of_a_run_whose_first_cells_did_not_run(unpacked):
    """The L4 tail's first cells are skips (hub models: no vLLM version recorded) and the run did not finish (its
    run.json names no version): the audit's table takes the version of the cells that ran."""
    run_dir = RunDir(unpacked / RUNS["L4"])
    table, unexplained = render({"L4-tail": rejudged(run_dir, CASES_DIR)})
    assert unexplained == 0 and "| L4-tail | L4 | H200 | 0.33.0 | 18 |" in table
