"""Reading results as a newcomer does: `report A B` of two runs of one class (a column per run), `diff B
--against <run folder>` (as `--against <run id>`), and `kvmatrix list` (each cell with the classes it runs on, the
cells kvmatrix adds marked with why, `--gpu`). Runs are of the fake cells through the production command."""

from __future__ import annotations

import re

from kvmatrix.harness import cli
from tests.conftest import CPU_CLASS, write_case
from tests.test_run_inputs import run_fake

TWO = {"model": "llama", "gpus": [CPU_CLASS], "matrix": {"kv_cache_dtype": ["auto", "bfloat16"]}}


def two_runs(cases_dir, tmp_path, monkeypatch) -> tuple[str, str]:
    write_case(cases_dir, "ok", TWO)
    for run_id in ("a", "b"):
        assert run_fake(cases_dir, tmp_path, monkeypatch, "--cases-dir", str(cases_dir), "--run-id", run_id) == 0
    return str(tmp_path / "runs" / "a"), str(tmp_path / "runs" / "b")


def test_a_report_of_two_runs_of_one_class_has_a_column_per_run(cases_dir, tmp_path, monkeypatch, capsys):
    """Before: one column ("4 cells" over 2 rows), each row's square one run's, the other's lost."""
    a, b = two_runs(cases_dir, tmp_path, monkeypatch)
    capsys.readouterr()
    assert cli.main(["report", a, b, "--out", str(tmp_path / "both")]) == 0
    text = (tmp_path / "both" / "matrix.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| cell"))
    assert f"{CPU_CLASS} (a)" in header and f"{CPU_CLASS} (b)" in header, header
    row = next(line for line in text.splitlines() if line.startswith("| ok[kv=auto,skip=-,spec=-]"))
    assert row.count("PASS") == 2, row


def test_diff_against_a_run_folder_as_against_its_id(cases_dir, tmp_path, monkeypatch, capsys):
    """Before: `--against reports/runs/a` said "no run reports/runs/a in the history" (exit 2)."""
    a, b = two_runs(cases_dir, tmp_path, monkeypatch)
    db = str(tmp_path / "history.sqlite")
    capsys.readouterr()
    assert cli.main(["diff", b, "--against", a, "--db", db]) == 0
    by_folder = capsys.readouterr().out
    assert cli.main(["diff", "b", "--against", "a", "--db", db]) == 0
    assert capsys.readouterr().out == by_folder and " a" in by_folder


def test_list_shows_where_each_cell_runs_and_marks_the_cells_kvmatrix_adds(cases_dir, capsys):
    """Before: every class of the pool for each cell (a FlashInfer cell "for" CPU classes its case skips), the eager
    oracles listed as if the case had them, and no --gpu. The case's model reference (bf16, plain, on the default
    backend) is added too: eager on these classes, its compiled combination compared with it."""
    write_case(cases_dir, "fi", {"model": "llama", "gpus": ["*"], "matrix": {"attention_backend": ["FLASHINFER"]},
                                 "skip": [{"when": {"gpu": {"device": "cpu"}}, "reason": "a CUDA backend"}]})
    assert cli.main(["list", "--cases-dir", str(cases_dir)]) == 0
    out, err = capsys.readouterr()
    lines = dict(line.split("  ", 1) for line in out.splitlines())
    own, oracle = "fi[kv=auto,skip=-,spec=-,attn=FLASHINFER]", "fi[kv=auto,skip=-,spec=-,attn=FLASHINFER,exec=eager]"
    compiled_reference = "fi[kv=bfloat16,skip=-,spec=-,attn=-]"
    reference = f"{compiled_reference[:-1]},exec=eager]"
    assert set(lines) == {own, oracle, compiled_reference, reference}
    assert "cpu-" not in lines[own] and "H100" in lines[own]
    assert "added" not in lines[own]
    assert lines[oracle].endswith("(added by kvmatrix, eager oracle: compiled or workload cells are compared with it)")
    assert lines[reference].endswith("(added by kvmatrix, model reference: the case's other plain cells are compared "
                                     "with it (an unquantized cache, eager, plain))")
    assert lines[compiled_reference].endswith("(added by kvmatrix, the model reference's combination run compiled, "
                                              "compared with its eager oracle, the reference there)")
    assert re.search(r"4 cells; 3 of them added by kvmatrix", err), err

    assert cli.main(["list", "--cases-dir", str(cases_dir), "--gpu", "H100"]) == 0
    out, err = capsys.readouterr()
    assert [line.split("  ")[:2] for line in out.splitlines()] == [
        [own, "[H100]"], [compiled_reference, "[H100]"], [oracle, "[H100]"], [reference, "[H100]"]]
    assert cli.main(["list", "--cases-dir", str(cases_dir), "--gpu", CPU_CLASS]) == 0
    assert capsys.readouterr().out == ""


def test_list_marks_a_model_reference_where_it_is_one(cases_dir, capsys):
    """An fp8 case's bf16 reference runs eager on a CPU class (the reference there) and compiled on a GPU class
    (compared with its eager oracle, the reference there): each class said."""
    write_case(cases_dir, "fp", {"model": "llama", "gpus": [CPU_CLASS, "H100"], "matrix": {"kv_cache_dtype": ["fp8"]}})
    assert cli.main(["list", "--cases-dir", str(cases_dir)]) == 0
    lines = dict(line.split("  ", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["fp[kv=bfloat16,skip=-,spec=-]"] == (
        f"[{CPU_CLASS}, H100]  (added by kvmatrix, model reference: the case's other plain cells are compared with it "
        f"(an unquantized cache, eager, plain) on {CPU_CLASS}; on the others the model reference's combination run "
        "compiled, compared with its eager oracle, the reference there)")
