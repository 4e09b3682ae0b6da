"""The findings status board: reports/findings/registry.yaml (each entry's scripts and the releases the sessions
saw) and status.json (what the scripts did, measured by `kvmatrix recheck`) make the board at the top of
reports/findings/README.md, which must be what they say; the first bad and first fixed release follow the releases
in order; a mistake in the registry names the file, the entry and the field."""

from __future__ import annotations

import json
import re

import pytest

from kvmatrix.harness.qualify.registry import (
    REGISTRY_FILE,
    STATUS_FILE,
    Check,
    board_rows,
    first_bad_and_fixed,
    load_registry,
    read_status,
    seen_on,
    write_status,
)
from kvmatrix.matrix.schema import CaseError
from kvmatrix.reports.findings_pages import BOARD_END, BOARD_START, board, with_board
from tests.conftest import FIXTURES

README = REGISTRY_FILE.parent / "README.md"
CACHE = REGISTRY_FILE.parents[2] / ".cache"  # the tiny models the scripts describe


def test_the_committed_board_is_what_the_registry_and_the_status_say():
    """`kvmatrix recheck --board-only` would write the README's board as it is."""
    expected = board(board_rows(load_registry(), read_status()))
    text = README.read_text()
    assert text.split(BOARD_START, 1)[1].split(BOARD_END, 1)[0].strip() == expected.strip()


def entries_of_the_page(text: str) -> list[str]:
    """The finding entries' headings, in order: the sections between the re-checks and the observations."""
    body = text.split("\n## Re-checks, session by session\n", 1)[1].split("\n## Observations that are not", 1)[0]
    return [line[3:] for line in body.splitlines() if line.startswith("## ")]


def test_the_page_the_board_and_the_registry_hold_the_same_findings_and_upstream_state():
    """Each entry of the page has a registry entry and a board row, in the same order, and the entry's upstream
    line says what the board's upstream column says (both from the registry)."""
    from kvmatrix.harness.qualify.registry import upstream_text

    findings = load_registry()
    text = README.read_text()
    board_ids = [line.split("](#", 1)[0].removeprefix("| [") for line in
                 text.split(BOARD_START, 1)[1].split(BOARD_END, 1)[0].splitlines() if line.startswith("| [")]
    assert entries_of_the_page(text) == [f.id for f in findings] == board_ids
    for finding in findings:
        section = text.split(f"\n## {finding.id}\n", 1)[1].split("\n## ", 1)[0]
        assert f"- **Upstream (vLLM's tracker):** {upstream_text(finding.upstream)}\n" in section, finding.id
    assert f"{sum(bool(f.upstream.known) for f in findings)} of the {len(findings)} entries are known" in text


def test_every_entry_of_the_page_is_on_the_board_and_every_script_names_a_cell():
    from kvmatrix.harness.repro.cell_script import find_cell
    from kvmatrix.matrix.load import CASES_DIR

    findings = load_registry()
    headings = {line[3:] for line in README.read_text().splitlines() if line.startswith("## ")}
    assert {f.id for f in findings} <= headings
    for finding in findings:
        assert finding.scripts or finding.no_script, finding.id
        for script in finding.scripts:
            cases = REGISTRY_FILE.parents[2] / script.cases_dir if script.cases_dir else CASES_DIR
            cell, _, pool = find_cell(cases, script.cell)
            assert script.gpu in cell.gpu_classes, (finding.id, script.gpu)


@pytest.mark.parametrize(("seen", "first_bad", "first_fixed"), [
    ({"0.22.0": "good", "0.24.0": "good", "0.26.0": "bad", "0.33.0": "bad"}, "0.26.0 (0.24.0 good)", "-"),
    ({"0.26.0": "bad", "0.30.0": "bad", "0.31.0": "good", "0.33.0": "good"}, "≤0.26.0", "0.31.0 (0.30.0 bad)"),
    ({"0.33.0": "good"}, "-", "-"),
    ({}, "-", "-"),
])
def test_first_bad_and_first_fixed(seen, first_bad, first_fixed):
    assert first_bad_and_fixed(seen) == (first_bad, first_fixed)


def check(finding: str, version: str, outcome: str, gpu: str = "H200") -> Check:
    return Check(finding, "deepseek-mla[kv=fp8,skip=0,spec=-,exec=eager]", gpu, "vllm", version, outcome,
                 1 if outcome == "bad" else 0, 30.0, 42, "said", "2026-12-05")


def test_a_script_run_on_a_new_release_moves_the_row(tmp_path):
    """A 0.34.0 run of the block-size finding's script: still fixed, its row says so with the run; the same
    script failing makes 0.34.0 bad again and the first fixed release disappears."""
    findings = {f.id: f for f in load_registry()}
    entry = findings["h200-mla-fp8-skip-no-common-block-size"]
    assert seen_on(entry, [check(entry.id, "0.34.0", "good")], "vllm")["0.34.0"] == "good"
    (row,) = board_rows([entry], [check(entry.id, "0.34.0", "good")])
    assert row["gpu"] == "0.34.0: fixed / right (script H200 exit 0, 2026-12-05)"
    assert row["first_fixed"] == "vllm 0.31.0 (0.30.0 bad)" and row["script"] == "H200: 42 lines, exit 0"
    (back,) = board_rows([entry], [check(entry.id, "0.34.0", "bad")])
    assert back["gpu"].startswith("0.34.0: **reproduces**") and back["first_fixed"] == "-"
    status = tmp_path / "status.json"
    write_status([check(entry.id, "0.34.0", "bad"), check(entry.id, "0.34.0", "good"),
                  check("gone", "0.34.0", "bad")], [entry], status)
    assert [c.outcome for c in read_status(status)] == ["good"]  # the later run of one script wins; gone is dropped


def test_the_board_replaces_only_its_section():
    page = f"# Findings\n\nintro\n\n{BOARD_START}\nold\n{BOARD_END}\n\n## entry\ntext\n"
    assert with_board(page, "new\n") == f"# Findings\n\nintro\n\n{BOARD_START}\nnew\n{BOARD_END}\n\n## entry\ntext\n"
    assert BOARD_START in with_board("# Findings\nbody\n", "new\n")


@pytest.mark.parametrize(("text", "field"), [
    ('- {id: a, bug: "yes", platform: moon, cells: x, upstream: {checked: 2026-12-05}}', "platform"),
    ('- {id: a, bug: "yes", platform: gpu, cells: x, upstream: {checked: 2026-12-05}, '
     'seen: {vllm: {"not a version": bad}}}', "not a version"),
    ('- {id: a, bug: "yes", platform: gpu, cells: x, upstream: {checked: 2026-12-05}, '
     'scripts: [{cell: c, gpu: H200, observe: smell}]}', "scripts.0.observe"),
    ('- {id: a, bug: "yes", platform: gpu, cells: x}', "upstream"),
    ('- {id: a, bug: "yes", platform: gpu, cells: x, upstream: {known: [vllm#1]}}', "upstream.checked"),
])
def test_a_registry_mistake_names_the_file_the_entry_and_the_field(tmp_path, text, field):
    path = tmp_path / "registry.yaml"
    path.write_text(text + "\n")
    with pytest.raises(CaseError) as raised:
        load_registry(path)
    assert str(path) in str(raised.value) and "'a'" in str(raised.value) and field in str(raised.value)


def test_the_status_file_is_every_script_run_of_the_registry():
    findings = {f.id: {(s.cell, s.gpu) for s in f.scripts} for f in load_registry()}
    checks = json.loads(STATUS_FILE.read_text())["checks"]
    assert checks and all((c["cell"], c["gpu"]) in findings[c["finding"]] for c in checks)


def test_a_script_run_on_another_class_of_its_kind_says_where_it_ran():
    """The H200's scripts on an H100 (one compute capability: vLLM decides alike, nothing emulated): the board says
    the class of the machine beside the script's; an A100's script there is emulated."""
    from kvmatrix.harness.qualify.recheck import decides_alike
    from kvmatrix.matrix.load import load_pool

    pool = load_pool()
    assert decides_alike(pool, "H200", "H100") and decides_alike(pool, "H200", "H200")
    assert not decides_alike(pool, "A100", "H100") and not decides_alike(pool, "cpu-avx512", "cpu-amx")
    entry = {f.id: f for f in load_registry()}["h200-mla-fp8-skip-no-common-block-size"]
    on_h100 = Check(entry.id, "deepseek-mla[kv=fp8,skip=0,spec=-,exec=eager]", "H200", "vllm", "0.34.0", "good", 0,
                    30.0, 42, "OK: ...", "2026-12-05", "H100")
    (row,) = board_rows([entry], [on_h100])
    assert row["gpu"] == "0.34.0: fixed / right (script H200 on H100 exit 0, 2026-12-05)"
    assert row["script"] == "H200 on H100: 42 lines, exit 0"


def test_each_script_of_a_finding_keeps_its_own_file():
    """The draft-fp8 finding's EAGLE-3 and DFlash scripts are both for the H200: neither overwrites the other."""
    from kvmatrix.harness.qualify.recheck import script_name

    entry = {f.id: f for f in load_registry()}["h200-draft-fp8-kv-under-bf16-target-crashes-flash-attn"]
    assert [script_name(entry, s) for s in entry.scripts] == [f"{entry.id}--H200--1.py", f"{entry.id}--H200--2.py"]


H100_RECHECK = FIXTURES / "recheck" / "h100-vllm-0.34.0-2026-12-05"
LOG_LINE = re.compile(r"^(bad|good|no verdict) +(\S+) \((.+?), vLLM (\S+)\): exit (\S+), ")


def test_an_h100_recheck_reads_as_the_scripts_classes_on_h100():
    """`benchmarks/recheck_on_gpu.sh` on an H100 with vLLM 0.34.0: each line the run printed is a check of its
    status file, on the script's class `on H100`; the board's GPU column names each of them with its exit."""
    checks = read_status(H100_RECHECK / "status.json")
    printed = [LOG_LINE.match(line).groups() for line in (H100_RECHECK / "recheck.log").read_text().splitlines()
               if LOG_LINE.match(line)]
    on_h100 = [c for c in checks if c.ran_on == "H100"]
    assert len(printed) == len(on_h100) == 14
    assert sorted(printed) == sorted((c.outcome, c.finding, c.where, c.version, str(c.exit)) for c in on_h100)
    assert {c.where for c in on_h100} == {"H200 on H100", "A100 on H100", "L4 on H100"}
    rows = {row["finding"]: row for row in board_rows(load_registry(), checks)}
    for c in on_h100:
        assert row_says(rows[c.finding]["gpu"], f"{c.where}", c.exit), (c.finding, rows[c.finding]["gpu"])
        assert rows[c.finding]["gpu"].startswith("0.34.0: ")


def row_says(text: str, where: str, code: int | None) -> bool:
    return re.search(rf"{re.escape(where)}( #\d)? exit {code}\b", text) is not None


def test_a_finding_with_two_scripts_for_one_class_shows_each():
    """The draft-fp8 finding's EAGLE-3 and DFlash scripts, both the H200's, both run on the H100: the board lists
    each by its number (scripts/<finding>--H200--N.py), neither hides the other."""
    checks = read_status(H100_RECHECK / "status.json")
    entry = {f.id: f for f in load_registry()}["h200-draft-fp8-kv-under-bf16-target-crashes-flash-attn"]
    (row,) = board_rows([entry], checks)
    assert row["script"] == "H200 on H100 #1: 46 lines, exit 1; H200 on H100 #2: 60 lines, exit 1"
    assert row["gpu"] == "0.34.0: **reproduces** (script H200 on H100 #1 exit 1, H200 on H100 #2 exit 1, 2026-12-05)"


def test_a_draft_says_the_machine_its_script_was_seen_on(tmp_path):
    """`kvmatrix recheck --drafts` from the H100 run: the H200 script's draft quotes what it said there and says it
    was an H100, where vLLM decides as on the H200; the A100's says its class was emulated."""
    from kvmatrix.harness.qualify.recheck import write_drafts

    checks = read_status(H100_RECHECK / "status.json")
    chosen = [f for f in load_registry() if f.id in ("h200-draft-fp8-kv-under-bf16-target-crashes-flash-attn",
                                                      "triton-fp8-kv-declared-below-sm89")]
    written = {p.name: p.with_suffix(".issue.md").read_text() for p in write_drafts(chosen, checks, tmp_path, CACHE)}
    eagle = written["h200-draft-fp8-kv-under-bf16-target-crashes-flash-attn--H200--1.py"]
    assert "seen on a real H100 (vLLM decides there as on the H200)" in eagle
    assert "FlashAttention only supports fp16, bf16, and fp8_e4m3 data type" in eagle.splitlines()[1]
    assert "Run the script and paste" not in eagle
    assert "seen on a real H100 (emulating the A100)" in written["triton-fp8-kv-declared-below-sm89--A100.py"]
