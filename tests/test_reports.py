"""Markdown, HTML and JUnit renderings of judged records (captured from real runs)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from markupsafe import escape

from kvmatrix.reports import html, junit, markdown
from kvmatrix.reports.html_details import details_json
from kvmatrix.reports.html_grid import grids, mark
from kvmatrix.reports.summary import cell_text
from tests.test_verdict import record, verdict


def judged(case: str, cell_id: str, fixture: str, gpu: str = "cpu-avx512") -> dict:
    rec = record(fixture) | {"cell_id": cell_id, "case": case, "gpu_class": gpu, "log": f"logs/{fixture}.log"}
    rec["verdict"], rec["reason"], rec["expectations"] = verdict(case, cell_id, rec, gpu)
    return rec


RECORDS = [
    judged("ct-llama", "ct-llama[kv=auto,skip=-,spec=-]", "ct_llama-auto"),
    judged("ct-llama", "ct-llama[kv=bfloat16,skip=-,spec=-]", "ct_llama-auto"),  # a regression: fail
    judged("deepseek-mla", "deepseek-mla[kv=fp8,skip=0,spec=-]", "deepseek_v2-fp8-skip0"),
    judged("deepseek-mla", "deepseek-mla[kv=fp8,skip=0,spec=-]", "deepseek_v2-fp8-skip0", gpu="H200"),
]


def test_cell_text_shows_the_resolved_state():
    assert cell_text(RECORDS[0]) == "PASS · backend CPU_ATTN · kv fp8 · page 16384"
    assert cell_text(RECORDS[2]) == ("XFAIL · backend CPU_MLA · kv auto/fp8 · q bfloat16 · page 18432/9216"
                                     " · sig dtype_mismatch_at_decode")


def test_markdown_matrix_has_cells_by_gpu_class_and_reasons():
    text = markdown.render(RECORDS, "t")
    assert "4 cells: 2 fail, 1 xfail, 1 pass" in text
    assert "kv_cache_dtype is 'fp8', expected 'bfloat16'" in text
    assert ("**XFAIL** `deepseek-mla[kv=fp8,skip=0,spec=-]` on cpu-avx512: expected failure backend_lacks_kv_dtype "
            "(dtype_mismatch_at_decode)" in text)
    header = next(line for line in text.splitlines() if line.startswith("| cell"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["cell", "cpu-avx512", "H200"]


def test_a_failure_says_which_other_cells_crashed_the_same_way_and_since_when():
    """The CPU MLA decode crash on two classes: one crash, dated by the history's first sighting when given."""
    fingerprint = RECORDS[2]["fingerprint"]
    assert RECORDS[3]["fingerprint"] == fingerprint and not RECORDS[1].get("fingerprint")
    text = markdown.render(RECORDS, "t", first_seen={fingerprint: "night-1"})
    assert "on H200: crash [dtype_mismatch_at_decode]" in text
    assert text.count("(same crash as 1 other cell; first seen night-1)") == 2
    page = html.render(RECORDS, "t", first_seen={fingerprint: "night-1"})
    assert page.count('<div class="same-crash">same crash as 1 other cell; first seen night-1</div>') == 2


def test_a_crash_no_signature_names_shows_its_fingerprint():
    unnamed = {**RECORDS[3], "signature": None}
    assert f"sig crash {unnamed['fingerprint']} (RuntimeError)" in cell_text(unnamed)


def test_html_colours_links_and_filters():
    page = html.render(RECORDS, "t")
    assert page.count('<td class="fail"') == 2 and page.count('<td class="xfail"') == 1
    assert '<a href="logs/ct_llama-auto.log">PASS</a>' in page
    assert 'id="filter-verdict"' in page and 'data-cell="ct-llama[kv=auto,skip=-,spec=-]"' in page


def test_a_grid_per_case_with_a_one_word_mark_per_square():
    ct, mla = grids(RECORDS, ["cpu-avx512", "H200"])
    assert (ct.case, ct.rows, ct.columns) == ("ct-llama", [("auto", "-"), ("bfloat16", "-")], [("cpu-avx512",)])
    assert mla.columns == [("cpu-avx512",), ("H200",)] and mla.rows == [("fp8", "0")]
    # the bf16 cell resolved fp8 (its regression), the MLA crash is named by its signature, a pass is a pass
    assert [mark(r) for r in RECORDS] == ["pass", "kv fp8", "dtype_mismatch_at_decode", "dtype_mismatch_at_decode"]
    view = mla.view(RECORDS)
    assert [h["axis"] for h in view["header"]] == ["gpu"]
    assert [sq["i"] for sq in view["rows"][0]["squares"]] == [2, 3] and not view["rows"][0]["all_skip"]


def test_details_json_shares_tables_and_links_a_failures_findings_page():
    data = json.loads(details_json(RECORDS, "../run/"))
    first, regression = data["records"][:2]
    assert first["L"] == regression["L"] and len(data["tables"]) < 3 * len(RECORDS)  # one fixture, one table
    assert data["tables"][first["L"]][0][:4] == ["model.layers.0.self_attn.attn", "target", "CPU_ATTN", "fp8"]
    assert regression["log"] == "../run/logs/ct_llama-auto.log"
    assert regression["finding"].startswith("../run/findings/cpu-avx512--ct-llama%5Bkv%3Dbfloat16")
    assert [e[1] for e in data["tables"][regression["E"]]].count(False) == 1 and "finding" not in first
    assert "<" not in details_json([{**RECORDS[0], "reason": "</script>"}])


def test_junit_counts_and_kinds():
    root = ET.fromstring(junit.render(RECORDS))
    suites = {s.get("name"): s for s in root}
    assert set(suites) == {"kvmatrix.cpu-avx512", "kvmatrix.H200"}
    cpu = suites["kvmatrix.cpu-avx512"]
    assert (cpu.get("tests"), cpu.get("failures"), cpu.get("skipped")) == ("3", "1", "1")
    kinds = {c.get("name"): [e.tag for e in c if e.tag != "system-out"] for c in cpu}
    assert kinds == {"ct-llama[kv=auto,skip=-,spec=-]": [], "ct-llama[kv=bfloat16,skip=-,spec=-]": ["failure"],
                     "deepseek-mla[kv=fp8,skip=0,spec=-]": ["skipped"]}


def test_a_failed_check_names_its_field_in_the_square_as_a_crash_names_its_signature():
    """A real failure that did not crash says what went wrong in its square, as an expected failure does."""
    wrong_page = {**RECORDS[2], "verdict": "fail", "signature": None, "fingerprint": None, "crash": None,
                  "expectations": [{"rule": "{'page_size_ratio': ...}", "ok": False,
                                    "detail": "page size skipped layers 36864 / not_skipped layers 36864 = 1, "
                                              "expected 2"}]}
    wrong_scale = {**wrong_page, "expectations": [{"rule": "{'layers': ...}", "ok": False,
                                                   "detail": "model.layers.0.self_attn.attn: k_scale is 1.0, "
                                                             "expected 0.5"}]}
    no_query = {**wrong_page, "expectations": [{"rule": "{'builders': ...}", "ok": False,
                                                "detail": "FLASHINFER builder (group 0): no q_data_type_prefill "
                                                          "recorded"}]}
    assert [mark(r) for r in (wrong_page, wrong_scale, no_query)] == ["page ratio", "k_scale",
                                                                      "no q_data_type_prefill"]


def test_html_has_a_colour_legend_and_harness_details_below_the_matrix():
    rerun = {**RECORDS[1], "warm_attempt": {"verdict": "fail", "reason": "x", "signature": None},
             "worker": {"pid": 1, "cells_before": 2}}
    page = html.render([RECORDS[0], rerun, *RECORDS[2:]], "t")
    legend = page[page.index('<dl id="legend"'):page.index("</dl>")]
    for shown in ("pass", "fail", "xfail", "error", "skip"):
        assert f'<dt class="sq {shown}">{shown}</dt><dd>{escape(html.LEGEND[shown])}</dd>' in legend
    assert "<h2>Run again" not in page and '<details id="reruns"><summary>Cells run again in a fresh process' in page
    assert page.index('id="grids"') < page.index('id="reruns"')
