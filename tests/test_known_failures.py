"""A user's own case meets what kvmatrix already knows of the installed vLLM: a failure its built-in cases expect
(with a link) or its waivers waive is that known failure in the user's case too (xfail, with the link and the rule
to copy), judged from a real AMX record; anything it does not know stays an unexplained FAIL, and the built-in
cases judge their own cells by their own rules."""

from __future__ import annotations

import copy
import datetime
from pathlib import Path

from kvmatrix.harness.judge.judge import judge_record
from kvmatrix.harness.judge.known_failures import known_failures_for
from kvmatrix.harness.record.neighbours import Neighbours
from kvmatrix.harness.record.task import Task
from kvmatrix.matrix.expand import expand_case
from kvmatrix.matrix.load import load_case, load_models, load_pool
from kvmatrix.reports import html, markdown
from tests.conftest import write_case
from tests.test_amx_records import AMX_RECORDS, amx_record

FP8_RECORD = AMX_RECORDS / "cpu-avx512--deepseek-mla[kv=fp8,skip=-,spec=-].json"
MY_MLA = {"description": "my MLA model with an fp8 KV cache", "model": "deepseek-mla", "gpus": [{"device": "cpu"}],
          "matrix": {"kv_cache_dtype": ["auto", "fp8"]}, "expect": [{"crash": False}]}
LINK = "reports/findings/README.md#cpu-mla-fp8-fails-at-decode"
TODAY = datetime.date(2026, 12, 5)


def judged_in(cases_dir: Path, name: str, data: dict, tmp_path: Path) -> dict:
    """The AMX record of deepseek-mla's fp8 cell, as the fp8 cell of a user's case `name` judged on cpu-amx."""
    path = write_case(cases_dir, name, data)
    pool = load_pool(cases_dir)
    (cell,) = [c for c in expand_case(load_case(path), load_models(cases_dir), pool, str(path))
               if c.axes["kv_cache_dtype"] == "fp8"]
    record = copy.deepcopy(amx_record(FP8_RECORD)) | {"cell_id": cell.cell_id, "case": name}
    return judge_record(record, Task(cell, "cpu-amx", pool["cpu-amx"]), Neighbours(), known=known_failures_for([cell]))


def test_amx_mlas_fp8_assert_in_a_users_case_is_the_known_failure_with_its_link(cases_dir, tmp_path):
    record = judged_in(cases_dir, "my-mla", MY_MLA, tmp_path)
    assert record["verdict"] == "xfail" and record["signature"] == "kv_dtype_unimplemented"
    assert record["reason"].startswith(f"known vLLM failure ({LINK}, as kvmatrix's cases/deepseek-mla.yaml expect.")
    assert "crash [kv_dtype_unimplemented] AssertionError: AMXMLAImpl only supports" in record["reason"]
    note = record["known_failure"]
    assert (note["verdict"], note["link"]) == ("fail", LINK)
    assert note["page"].endswith("reports/findings/README.md#cpu-mla-fp8-fails-at-decode")
    assert Path(note["page"].partition("#")[0]).is_file()
    assert note["rule"] == ("- when: {kv_cache_dtype: fp8, gpu: {device: cpu}}\n"
                            f"  crash: {{signature: backend_lacks_kv_dtype, link: {LINK}}}\n")
    text = markdown.render([record], "t")
    assert "## Known vLLM failures in these cases" in text and "  - when: {kv_cache_dtype: fp8" in text
    assert '"known":{"link":"reports/findings/README.md#cpu-mla-fp8-fails-at-decode"' in html.render([record])

    # The rule copied into the case as offered: the case's own expected failure, nothing borrowed.
    import yaml

    copied = {**MY_MLA, "expect": [*MY_MLA["expect"], *yaml.safe_load(note["rule"])]}
    again = judged_in(cases_dir, "my-mla", copied, tmp_path)
    assert again["verdict"] == "xfail" and "known_failure" not in again
    assert again["reason"].startswith("expected failure backend_lacks_kv_dtype (kv_dtype_unimplemented)")


def test_what_kvmatrix_does_not_know_stays_an_unexplained_fail(cases_dir, tmp_path):
    """The same crash under another model (the built-in rule is the MLA model's) is not explained by it."""
    record = judged_in(cases_dir, "other", {**MY_MLA, "model": "llama"}, tmp_path)
    assert record["verdict"] == "fail" and "known_failure" not in record


def test_a_known_failure_is_applied_afresh_when_judged_again(cases_dir, tmp_path):
    """A stored record explained once is judged from scratch: under a case whose model has no such known failure,
    the explanation is gone."""
    record = judged_in(cases_dir, "my-mla", MY_MLA, tmp_path)
    pool = load_pool(cases_dir)
    path = write_case(cases_dir, "my-mla", {**MY_MLA, "model": "llama"})
    (cell,) = [c for c in expand_case(load_case(path), load_models(cases_dir), pool, str(path))
               if c.axes["kv_cache_dtype"] == "fp8"]
    again = judge_record(record, Task(cell, "cpu-amx", pool["cpu-amx"]), Neighbours(), known=known_failures_for([cell]))
    assert again["verdict"] == "fail" and "known_failure" not in again


def test_judging_reads_no_file(cases_dir, tmp_path, monkeypatch):
    """What is known is read before judging (`known_failures_for`); judging itself, a user's failure explained by
    it included, opens, stats and resolves nothing, whatever the current folder."""
    import builtins
    import os

    path = write_case(cases_dir, "my-mla", MY_MLA)
    pool = load_pool(cases_dir)
    (cell,) = [c for c in expand_case(load_case(path), load_models(cases_dir), pool, str(path))
               if c.axes["kv_cache_dtype"] == "fp8"]
    record = copy.deepcopy(amx_record(FP8_RECORD)) | {"cell_id": cell.cell_id, "case": "my-mla"}
    known = known_failures_for([cell])
    monkeypatch.chdir(tmp_path)

    def refused(*args, **kwargs):
        raise AssertionError(f"judging touched the file system: {args[:1]}")

    for owner, name in [(builtins, "open"), (os, "stat"), (os, "scandir"), (os, "listdir"), (Path, "open"),
                        (Path, "stat"), (Path, "exists"), (Path, "is_file"), (Path, "resolve"), (Path, "read_text"),
                        (Path, "read_bytes"), (Path, "glob"), (Path, "iterdir")]:
        monkeypatch.setattr(owner, name, refused)
    try:
        judged = judge_record(record, Task(cell, "cpu-amx", pool["cpu-amx"]), Neighbours(), today=TODAY, known=known)
    finally:
        monkeypatch.undo()  # pytest itself reads files to report
    assert judged["verdict"] == "xfail" and judged["known_failure"]["link"] == LINK
