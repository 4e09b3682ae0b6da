"""Findings pages from records captured on real runs: one page per unexplained failure, with a reproducer."""

from __future__ import annotations

import json

from kvmatrix.harness.judge.fingerprint import stamp
from kvmatrix.reports import findings_pages
from tests.conftest import FIXTURES
from tests.test_verdict import record, verdict

H200 = FIXTURES / "records" / "h200-vllm-0.26.0"


def h200(name: str) -> dict:
    return json.loads((H200 / f"{name}.json").read_text())


def test_a_crash_gets_a_page_with_its_reproducer_and_error(tmp_path):
    crash = h200("H200--deepseek-mla[kv=fp8,skip=0,spec=-]")
    passed = h200("H200--llama-dflash[kv=fp8,skip=4,spec=llama-dflash]")
    (written,) = findings_pages.write([crash, passed], tmp_path)
    text = written.read_text()
    assert "kvmatrix run --gpu H200 --cell 'deepseek-mla[kv=fp8,skip=0,spec=-]'" in text
    # the script observes what the record failed on: its run folder goes with the command
    assert (f"kvmatrix repro 'deepseek-mla[kv=fp8,skip=0,spec=-]' --run reports/runs/{crash['run_id']} --gpu H200 "
            "--out repro.py") in text
    assert "vLLM 0.26.0, torch 2.11.0+cu130" in text
    assert "signature `no_common_block_size`" in text
    assert "ValueError: No common block size for 32." in text
    assert "No resolved state was recorded" in text
    assert '"kv_cache_dtype_skip_layers": ["0"]' in text  # the cell's own engine arguments, not the harness's
    index = (tmp_path / "README.md").read_text()
    assert "`deepseek-mla[kv=fp8,skip=0,spec=-]` | H200 | 0.26.0 | no_common_block_size" in index
    assert "llama-dflash" not in index


def test_an_emulated_failure_reproduces_with_emulate(tmp_path):
    (written,) = findings_pages.write([h200("B200--fp8-every-backend[kv=fp8_e5m2,skip=-,spec=-,attn=-]")], tmp_path)
    assert "kvmatrix run --gpu B200 --emulate --cell" in written.read_text()
    assert "emulated on a real H200" in written.read_text()


def test_a_wrong_resolved_state_lists_the_unmet_rule_and_every_layer(tmp_path):
    # The checkpoint's fp8 where bfloat16 was asked: the record of ct-llama[kv=auto] judged as the bfloat16 cell.
    rec = record("ct_llama-auto")
    cell_id = "ct-llama[kv=bfloat16,skip=-,spec=-]"
    result, reason, rules = verdict("ct-llama", cell_id, rec)
    rec.update(cell_id=cell_id, gpu_class="cpu-avx512", verdict=result, reason=reason, expectations=rules)
    (written,) = findings_pages.write([rec], tmp_path)
    text = written.read_text()
    assert "kv_cache_dtype is 'fp8', expected 'bfloat16'" in text
    assert "| model.layers.0.self_attn.attn | target | CPU_ATTN | fp8 |" in text


def test_expected_failures_and_waived_ones_write_nothing(tmp_path):
    xfail = {**h200("H200--deepseek-mla[kv=fp8,skip=0,spec=-]"), "verdict": "xfail"}
    assert findings_pages.write([xfail], tmp_path) == []
    assert not (tmp_path / "README.md").exists()


def test_failures_with_one_crash_link_to_each_other(tmp_path):
    """FlashInfer's query dtype crash on the real H200 and the emulated B200: two pages that link to each other
    and sit together in the index; the MLA block size failure is another crash and links to neither."""
    crashes = [h200(f"{gpu}--fp8-every-backend[kv=fp8_e5m2,skip=-,spec=-,attn=-]") for gpu in ("H200", "B200")]
    other = h200("H200--deepseek-mla[kv=fp8,skip=0,spec=-]")
    for captured in [*crashes, other]:
        stamp(captured)  # records captured before fingerprints: as `kvmatrix rejudge` fingerprints them
    pages = {path.name: path.read_text() for path in findings_pages.write([other, *crashes], tmp_path)}
    b200, h200_page = (findings_pages.page_name(r) for r in crashes)
    assert "## Same crash in 1 other cell" in pages[b200] and f"({h200_page})" in pages[b200]
    assert f"({b200})" in pages[h200_page]
    assert "Same crash" not in pages[findings_pages.page_name(other)]
    assert f"- fingerprint `{crashes[0]['fingerprint']}`: `ValueError` in `vllm.v1.attention.backends" in pages[b200]
    rows = [line for line in (tmp_path / "README.md").read_text().splitlines() if line.startswith("| `")]
    assert [row.split(" | ")[4] for row in rows] == [crashes[0]["fingerprint"]] * 2 + [other["fingerprint"]]


def test_a_crash_no_signature_names_is_shown_by_its_fingerprint(tmp_path):
    crash = {**h200("H200--deepseek-mla[kv=fp8,skip=0,spec=-]"), "signature": None}
    stamp(crash)
    (written,) = findings_pages.write([crash], tmp_path)
    assert f"signature `crash {crash['fingerprint']} (ValueError)`" in written.read_text()
    index = (tmp_path / "README.md").read_text()
    assert f"crash {crash['fingerprint']} (ValueError) | {crash['fingerprint']} |" in index
